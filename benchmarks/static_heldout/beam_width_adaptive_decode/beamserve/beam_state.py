from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch


@dataclass
class BeamRequest:
    rid: int
    prompt_len: int
    width: int
    slot: int = -1
    beam_pages: List[List[int]] = field(default_factory=list)
    beam_lens: List[int] = field(default_factory=list)
    finished: bool = False


class BeamTable:
    """Per-slot beam widths, cumulative scores and parent ids for the running requests."""

    def __init__(self, max_requests: int, max_beam: int, device: torch.device):
        self.max_requests = max_requests
        self.max_beam = max_beam
        self.widths = torch.ones(max_requests, dtype=torch.int32, device=device)
        self.widths_cpu = np.ones(max_requests, dtype=np.int32)
        self.scores = torch.zeros(max_requests, max_beam, dtype=torch.float32, device=device)
        self.parent_ids = torch.zeros(max_requests, max_beam, dtype=torch.int64, device=device)

    @property
    def max_width(self) -> int:
        return int(self.widths.max())  # expect: FC101

    @property
    def max_width_host(self) -> int:
        return int(self.widths_cpu.max())  # ok: FC101

    def set_width(self, slot: int, width: int) -> None:
        w = int(width)
        assert 1 <= w <= self.max_beam  # expect: FC109
        self.widths_cpu[slot] = w
        self.widths[slot] = w

    def rows_of(self, slots: List[int]) -> np.ndarray:
        widths = self.widths_cpu[slots]
        return np.repeat(np.asarray(slots), widths)
