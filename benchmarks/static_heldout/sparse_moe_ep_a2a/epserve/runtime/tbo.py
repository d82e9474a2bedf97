"""Splits a decode batch into micro-batches for two-batch overlap and builds their host metadata."""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from epserve.config import EPConfig
from epserve.layers import MicroBatchAttnBackend, MicroBatchMeta


class TwoBatchSplitter:
    def __init__(self, backend: MicroBatchAttnBackend, cfg: EPConfig, device: torch.device):
        self.backend = backend
        self.cfg = cfg
        self.device = device

    def _bucket(self, bs: int) -> int:
        for b in self.cfg.graph_buckets:
            if b >= bs:
                return b
        return 0

    def _balanced_split_point(self, kv_lens_np: np.ndarray) -> int:
        # split where the KV work of the two halves is closest, not where the request counts are equal
        cum = np.cumsum(kv_lens_np)
        return int(np.clip(np.searchsorted(cum, cum[-1] / 2), 1, len(kv_lens_np) - 1))

    def _make_meta(
        self, mb: Optional[int], lo: int, hi: int, kv_lens_np: np.ndarray, page_table_np: np.ndarray, block_tables: torch.Tensor
    ) -> MicroBatchMeta:
        cfg = self.cfg
        row = 0 if mb is None else mb
        n = hi - lo
        bucket = self._bucket(n) if mb is not None else 0
        lens = kv_lens_np[lo:hi]
        pages = (lens + cfg.page_size - 1) // cfg.page_size
        indptr = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        num_pages = int(indptr[-1])
        width = max(bucket, n)
        qo_cpu = self.backend.qo_indptr_cpu[row, : width + 1]
        kv_cpu = self.backend.kv_indptr_cpu[row, : width + 1]
        len_cpu = self.backend.kv_len_cpu[row, :width]
        qo_cpu[: n + 1] = torch.arange(n + 1, dtype=torch.int32)
        qo_cpu[n + 1 :] = n
        kv_cpu[: n + 1] = torch.from_numpy(indptr)
        kv_cpu[n + 1 :] = num_pages
        len_cpu[:n] = torch.from_numpy(lens.astype(np.int32))
        len_cpu[n:] = 1
        flat = np.concatenate([page_table_np[lo + i, : pages[i]] for i in range(n)])
        long_idx = np.flatnonzero(lens > cfg.long_row_threshold)
        meta = MicroBatchMeta(
            micro_batch=mb,
            bucket=bucket,
            batch_size=n,
            num_pages=num_pages,
            qo_indptr_cpu=qo_cpu,
            kv_indptr_cpu=kv_cpu,
            kv_lens_cpu=len_cpu,
            kv_indices=torch.from_numpy(flat).to(self.device, non_blocking=True),
            kv_lens=len_cpu[:n].to(self.device, non_blocking=True),
            block_tables=block_tables[lo:hi],
            max_kv_len=int(lens.max()),
        )
        if long_idx.size:
            meta.has_long_rows = True
            meta.long_rows = torch.from_numpy(long_idx).to(self.device, non_blocking=True)
            long_pages = pages[long_idx]
            meta.long_kv_indptr_cpu = torch.from_numpy(np.concatenate([[0], np.cumsum(long_pages)]).astype(np.int32))
            meta.long_kv_lens_cpu = torch.from_numpy(lens[long_idx].astype(np.int32))
        return meta

    def split(self, kv_lens_np: np.ndarray, page_table_np: np.ndarray, block_tables: torch.Tensor) -> List[MicroBatchMeta]:
        bs = len(kv_lens_np)
        if bs < self.cfg.tbo_min_batch:
            return [self._make_meta(None, 0, bs, kv_lens_np, page_table_np, block_tables)]
        half = self._balanced_split_point(kv_lens_np)
        return [
            self._make_meta(0, 0, half, kv_lens_np, page_table_np, block_tables),
            self._make_meta(1, half, bs, kv_lens_np, page_table_np, block_tables),
        ]

    def dummy(self, bs: int) -> List[MicroBatchMeta]:
        lens = np.full(bs, self.cfg.page_size, dtype=np.int64)
        table = np.arange(bs, dtype=np.int32)[:, None]
        blocks = torch.arange(bs, dtype=torch.int32, device=self.device)[:, None]
        if bs < self.cfg.tbo_min_batch:
            return [self._make_meta(0, 0, bs, lens, table, blocks)]
        half = bs // 2
        return [self._make_meta(0, 0, half, lens, table, blocks), self._make_meta(1, half, bs, lens, table, blocks)]
