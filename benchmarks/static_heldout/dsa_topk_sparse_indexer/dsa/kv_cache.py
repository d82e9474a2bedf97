"""Latent MLA cache plus the indexer's key cache, addressed by token slot."""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import torch

from .config import DSAConfig


class MLATokenPool:
    """Pages of `page_size` token slots.  Slot = page * page_size + offset.

    The sparse MLA wrappers run with page_size=1 over a token view of the same
    storage, so a selected token slot is directly a kv index.
    """

    def __init__(self, cfg: DSAConfig, num_pages: int, device: torch.device):
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.num_pages = num_pages
        self.device = device
        dt = getattr(torch, cfg.dtype)
        self.kv = torch.zeros(num_pages, cfg.page_size, cfg.latent_dim, dtype=dt, device=device)
        self.index_k = torch.zeros(num_pages * cfg.page_size, cfg.index_head_dim, dtype=dt, device=device)
        self.page_table_np = np.zeros((cfg.max_batch_size, cfg.max_pages_per_request()), dtype=np.int32)
        self.page_table = torch.zeros(
            cfg.max_batch_size, cfg.max_pages_per_request(), dtype=torch.int32, device=device
        )
        # page 0 is the dummy page padded rows point at
        self._free: List[int] = list(range(num_pages - 1, 0, -1))
        self._pages: Dict[int, List[int]] = {}

    # ----------------------------------------------------------------- host side
    def ensure_pages(self, pool_idx: int, seq_len: int) -> None:
        pages = self._pages.setdefault(pool_idx, [])
        need = -(-seq_len // self.page_size)
        if need <= len(pages):
            return
        if need - len(pages) > len(self._free):
            raise RuntimeError(f"out of KV pages: need {need - len(pages)}, free {len(self._free)}")
        while len(pages) < need:
            page = self._free.pop()
            self.page_table_np[pool_idx, len(pages)] = page
            pages.append(page)
        row = torch.from_numpy(self.page_table_np[pool_idx])
        self.page_table[pool_idx].copy_(row, non_blocking=True)

    def release(self, pool_idx: int) -> None:
        self._free.extend(reversed(self._pages.pop(pool_idx, [])))
        self.page_table_np[pool_idx].fill(0)

    def slots_for(self, pool_idx: int, start: int, n: int) -> np.ndarray:
        pos = np.arange(start, start + n, dtype=np.int64)
        pages = self.page_table_np[pool_idx, pos // self.page_size].astype(np.int64)
        return pages * self.page_size + pos % self.page_size

    def page_csr(self, pool_indices: List[int], seq_lens_np: np.ndarray):
        counts = -(-seq_lens_np // self.page_size)
        indptr = np.zeros(len(pool_indices) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        rows = [self.page_table_np[p, :c] for p, c in zip(pool_indices, counts)]
        indices = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int32)
        return indptr, indices.astype(np.int32)

    # --------------------------------------------------------------- device side
    def token_slot_table(self, req_pool_indices: torch.Tensor, max_ctx: int) -> torch.Tensor:
        pos = torch.arange(max_ctx, device=self.page_table.device)
        pages = self.page_table[req_pool_indices][:, pos // self.page_size].long()
        return pages * self.page_size + (pos % self.page_size)[None, :]

    def token_view(self) -> torch.Tensor:
        return self.kv.view(-1, 1, self.cfg.latent_dim)

    def ckv_kpe_tokens(self):
        tok = self.token_view()
        return tok[..., : self.cfg.kv_lora_rank], tok[..., self.cfg.kv_lora_rank :]

    def write_latent(self, slots: torch.Tensor, latent: torch.Tensor) -> None:
        self.token_view().index_copy_(0, slots, latent.unsqueeze(1).to(self.kv.dtype))
