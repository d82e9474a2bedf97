"""Request-to-page table for the paged KV cache."""

from __future__ import annotations

import torch

from tmeta.config import EngineConfig


class ReqToTokenPool:
    """Maps a request slot to the KV pages it owns (one row of page ids per slot)."""

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.page_size = cfg.page_size
        self.size = cfg.max_batch_size * 2
        self.req_to_page = torch.zeros(self.size, cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self._free: list[int] = list(range(self.size))

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"request pool exhausted: need {n} slots, {len(self._free)} free")
        slots, self._free = self._free[:n], self._free[n:]
        return slots

    def free(self, slots: list[int]) -> None:
        self._free.extend(slots)

    def page_counts(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        return (seq_lens + self.page_size - 1) // self.page_size

    def fill_indices(
        self,
        out: torch.Tensor,
        req_pool_indices: torch.Tensor,
        kv_indptr: torch.Tensor,
        bs: int,
        total: int,
    ) -> None:
        """Gather each request's pages into the flat ``out[:total]`` laid out by ``kv_indptr``."""
        counts = kv_indptr[1 : bs + 1] - kv_indptr[:bs]
        rows = torch.repeat_interleave(req_pool_indices[:bs], counts, output_size=total)  # ok: FC101
        starts = torch.repeat_interleave(kv_indptr[:bs], counts, output_size=total)
        cols = torch.arange(total, device=out.device) - starts
        out[:total] = self.req_to_page[rows, cols]
