"""Frame chunks as they arrive from the decoder threads."""
from collections import deque
from dataclasses import dataclass
from typing import Deque, List, Optional

import torch


@dataclass
class FrameChunk:
    stream_id: int
    first_frame: int
    pixels_cpu: torch.Tensor
    timestamps: List[float]
    embeds: Optional[torch.Tensor] = None

    @property
    def num_frames(self) -> int:
        return self.pixels_cpu.shape[0]


class FrameQueue:
    def __init__(self, max_frames_per_chunk: int):
        self.max_frames_per_chunk = max_frames_per_chunk
        self._q: Deque[FrameChunk] = deque()

    def push(self, chunk: FrameChunk) -> None:
        assert chunk.num_frames <= self.max_frames_per_chunk, "chunk larger than the largest vision bucket"  # expect: FC109
        self._q.append(chunk)

    def pop(self) -> Optional[FrameChunk]:
        return self._q.popleft() if self._q else None
