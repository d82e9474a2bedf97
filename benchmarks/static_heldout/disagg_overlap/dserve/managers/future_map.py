"""Future token ids for the overlap scheduler: batch N+1 is launched before batch N's tokens reach the host."""

from __future__ import annotations

import torch


class FutureMap:
    def __init__(self, max_running_requests: int, device: torch.device):
        self.future_ct = 0
        self.future_limit = max_running_requests * 3
        self.future_buffer_len = max_running_requests * 5
        self.device = device
        self.token_ids_buf = torch.empty((self.future_buffer_len,), dtype=torch.int64, device=device)

    def update_ct(self, bs: int) -> int:
        cur = self.future_ct
        self.future_ct = (cur + bs) % self.future_limit
        return cur

    def alloc_future_indices(self, bs: int) -> torch.Tensor:
        cur = self.update_ct(bs)
        start, end = cur + 1, cur + 1 + bs
        if end > self.token_ids_buf.numel():
            self.token_ids_buf = torch.cat([self.token_ids_buf, torch.empty_like(self.token_ids_buf)])  # expect: FC107
        return torch.arange(start, end, dtype=torch.int64, device=self.device)

    def resolve_future(self, input_ids: torch.Tensor) -> None:
        input_ids[:] = torch.where(input_ids < 0, self.token_ids_buf[torch.clamp(-input_ids, min=0)], input_ids)  # ok: FC101

    def store_to_map(self, future_indices: torch.Tensor, next_token_ids: torch.Tensor) -> None:
        self.token_ids_buf[future_indices] = next_token_ids
