from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List

import numpy as np


@dataclass
class StreamState:
    sid: int
    text_ids: List[int]
    text_pos: int = 0
    pages: List[int] = field(default_factory=list)
    kv_len: int = 0
    frames: int = 0
    codes: Deque[np.ndarray] = field(default_factory=deque)
    done: bool = False


class ChunkScheduler:
    """Admits streams and hands out chunks of frames so every stream gets audio at the frame rate."""

    def __init__(self, max_streams: int, max_text: int):
        self.max_streams = max_streams
        self.max_text = max_text
        self.streams: Dict[int, StreamState] = {}
        self.started = False

    def _check_ring(self) -> None:
        assert len(self.streams) <= self.max_streams  # ok: FC109

    def add_stream(self, sid: int, text_ids: List[int]) -> StreamState:
        assert len(text_ids) <= self.max_text  # expect: FC109
        st = StreamState(sid=sid, text_ids=list(text_ids))
        self.streams[sid] = st
        self._check_ring()
        return st

    def next_chunk(self) -> List[StreamState]:
        assert self.started  # ok: FC109
        live = [s for s in self.streams.values() if not s.done]
        live.sort(key=lambda s: s.frames)
        return live[: self.max_streams]

    def retire(self, sid: int) -> None:
        self.streams.pop(sid, None)
