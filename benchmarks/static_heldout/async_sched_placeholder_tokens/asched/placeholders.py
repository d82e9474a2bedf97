"""Swap placeholder ids for the previous step's sampled ids, on the device."""
from typing import Optional

import torch


class PlaceholderResolver:
    def __init__(self, max_num_tokens: int, max_num_reqs: int, device: torch.device):
        assert max_num_tokens >= max_num_reqs, "every request needs a token slot"  # expect: FC109
        self.device = device
        self.token_ids = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)
        self.mask = torch.zeros(max_num_tokens, dtype=torch.bool, device=device)
        self.src_index: Optional[torch.Tensor] = None
        self._gather_scratch: Optional[torch.Tensor] = None
        self._unresolved = torch.zeros(1, dtype=torch.int32, device=device)

    @property
    def num_unresolved(self) -> int:
        """Placeholders left after the swap (a previous row that was never sampled)."""
        return int(self._unresolved[0])  # expect: FC101

    def resolve(
        self,
        token_ids_cpu: torch.Tensor,
        mask_cpu: torch.Tensor,
        prev_slot_cpu: torch.Tensor,
        prev_sampled: torch.Tensor,
    ) -> torch.Tensor:
        n = token_ids_cpu.shape[0]
        self.token_ids[:n].copy_(token_ids_cpu, non_blocking=True)
        self.mask[:n].copy_(mask_cpu, non_blocking=True)
        if self.src_index is None or self.src_index.numel() < n:
            self.src_index = torch.empty(max(n, 64), dtype=torch.int64, device=self.device)  # expect: FC107
        self.src_index[:n].copy_(prev_slot_cpu, non_blocking=True)
        if self._gather_scratch is None:
            self._gather_scratch = torch.empty(self.token_ids.numel(), dtype=torch.int64, device=self.device)  # ok: FC107
        is_placeholder = self.mask[:n]
        if is_placeholder.any():  # expect: FC101
            idx = self.src_index[:n].clamp(min=0)
            gathered = torch.index_select(prev_sampled, 0, idx, out=self._gather_scratch[:n])
            self.token_ids[:n] = torch.where(is_placeholder, gathered, self.token_ids[:n])  # ok: FC101
        self._unresolved.copy_((self.token_ids[:n] < 0).sum().view(1))
        return self.token_ids[:n]
