"""Token slots live on the device: a free mask, allocation by top-k over it."""
from __future__ import annotations

from typing import List, Optional

import torch


class PagedTokenAllocator:
    def __init__(self, num_slots: int, page_size: int, device: torch.device):
        assert page_size == 1 or num_slots % page_size == 0, "slot count must be a whole number of pages"  # expect: FC109
        self.device = device
        self.free_mask = torch.ones(num_slots, dtype=torch.bool, device=device)
        self.free_mask[0] = False  # slot 0 is the padding slot

    def alloc(self, n: int) -> Optional[torch.Tensor]:
        if n > int(self.free_mask.sum()):  # expect: FC101
            return None
        slots = torch.topk(self.free_mask.to(torch.int8), n, sorted=False).indices
        self.free_mask[slots] = False
        return slots.to(torch.int32)

    def free(self, slots: torch.Tensor) -> None:
        self.free_mask[slots.long()] = True


class ReqToTokenPool:
    def __init__(self, max_reqs: int, max_context_len: int, device: torch.device):
        self.req_to_token = torch.zeros(max_reqs, max_context_len, dtype=torch.int32, device=device)
        self.free_rows: List[int] = list(range(max_reqs))

    def alloc_row(self) -> int:
        return self.free_rows.pop()

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.req_to_token[row, start : start + slots.numel()] = slots
