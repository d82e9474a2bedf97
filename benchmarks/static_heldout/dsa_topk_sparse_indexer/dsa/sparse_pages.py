"""Turn the indexer's per-request top-k token slots into a CSR the MLA wrapper reads."""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import numpy as np
import torch

from .config import DSAConfig


@dataclasses.dataclass
class SparseLayout:
    bs: int
    k: int
    total: int
    counts_np: np.ndarray
    kv_indptr_np: np.ndarray
    rows_np: np.ndarray
    cols_np: np.ndarray


class SparseIndexBuilder:
    """Host layout of the selected tokens: request i owns min(seq_len_i, topk) slots."""

    def __init__(self, cfg: DSAConfig, device):
        self.cfg = cfg
        self.device = device
        self.max_bs = cfg.max_batch_size
        self.topk = cfg.index_topk
        self._gather_idx = torch.empty(2, 4096, dtype=torch.long, device=device)
        self._col_base: Optional[torch.Tensor] = None
        # (bs, total, k) of the last layout, for the step trace
        self._plan_info: Optional[Tuple[int, int, int]] = None

    def layout(self, seq_lens_np: np.ndarray) -> SparseLayout:
        bs = int(seq_lens_np.shape[0])
        assert bs <= self.max_bs, f"decode batch of {bs} exceeds max_batch_size={self.max_bs}"  # expect: FC109
        counts = np.minimum(seq_lens_np, self.topk).astype(np.int32)
        indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        total = int(indptr[-1])
        rows = np.repeat(np.arange(bs, dtype=np.int64), counts)
        cols = np.arange(total, dtype=np.int64) - np.repeat(indptr[:-1].astype(np.int64), counts)
        k = int(counts.max()) if bs else 0  # ok: FC101
        self._plan_info = (bs, total, k)  # ok: FC103
        return SparseLayout(bs, k, total, counts, indptr, rows, cols)

    def last_layout(self) -> Optional[Tuple[int, int, int]]:
        return self._plan_info

    def _upload(self, layout: SparseLayout) -> Tuple[torch.Tensor, torch.Tensor]:
        n = layout.total
        if self._gather_idx.shape[1] < n:
            self._gather_idx = torch.empty(2, 2 * n, dtype=torch.long, device=self.device)  # expect: FC107
        idx = self._gather_idx[:, :n]
        host = torch.from_numpy(np.stack([layout.rows_np, layout.cols_np]))
        idx.copy_(host, non_blocking=True)
        return idx[0], idx[1]

    def _col_range(self) -> torch.Tensor:
        if self._col_base is None:
            self._col_base = torch.arange(self.topk, device=self.device)  # ok: FC107
        return self._col_base

    def flatten(self, picked: torch.Tensor, layout: SparseLayout) -> torch.Tensor:
        """[bs, k] picks -> flat CSR slots, gathered at host-computed (row, col) pairs."""
        rows, cols = self._upload(layout)
        return picked[rows, cols]  # ok: FC101

    def flatten_masked(self, picked: torch.Tensor, sparse_lens: torch.Tensor) -> torch.Tensor:
        """Batches past the largest bucket: skip the index upload and mask the tail."""
        col = self._col_range()[: picked.shape[1]]
        keep = col[None, :] < sparse_lens[:, None]
        return picked[keep]  # expect: FC101
