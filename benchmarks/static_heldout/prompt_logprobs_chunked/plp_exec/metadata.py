"""Chunk metadata: FlashInfer indices and the rows whose prompt logprobs the chunk produces."""

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from plp.config import LogprobConfig
from plp.requests import ChunkPlan


@dataclass
class ChunkPrefillMeta:
    batch_size: int
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indptr_gpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    logprob_rows: torch.Tensor
    logprob_targets: torch.Tensor
    num_logprob_rows: int
    row_spans: Dict[int, Tuple[int, int]]
    ranks_out: Optional[torch.Tensor] = None


@dataclass
class DecodeMeta:
    batch_size: int
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor


@dataclass
class DecodeGraphBuffers:
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor


def _pinned(n: int, dtype=torch.int32) -> torch.Tensor:
    return torch.zeros(n, dtype=dtype, pin_memory=True)


class ChunkMetadataBuilder:
    def __init__(self, cfg: LogprobConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        nb = cfg.max_batch + 1
        self.qo_pinned = _pinned(nb)
        self.kv_pinned = _pinned(nb)
        self.last_pinned = _pinned(cfg.max_batch)
        self.indices_pinned = _pinned(cfg.max_pages)
        self.rows_pinned = _pinned(cfg.max_num_tokens, torch.int64)
        self.targets_pinned = _pinned(cfg.max_num_tokens, torch.int64)
        self.qo_np = self.qo_pinned.numpy()
        self.kv_np = self.kv_pinned.numpy()
        self.last_np = self.last_pinned.numpy()
        self.indices_np = self.indices_pinned.numpy()
        self.rows_np = self.rows_pinned.numpy()
        self.targets_np = self.targets_pinned.numpy()
        self.indices_dev = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.rows_dev = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=device)
        self.targets_dev = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=device)

    def _pages(self, bs: int, kv_lens: np.ndarray, page_table_np: np.ndarray) -> int:
        ps = self.cfg.page_size
        pages = (kv_lens + ps - 1) // ps
        self.kv_np[0] = 0
        np.cumsum(pages, out=self.kv_np[1 : bs + 1])
        for i in range(bs):
            self.indices_np[self.kv_np[i] : self.kv_np[i + 1]] = page_table_np[i, : pages[i]]
        self.last_np[:bs] = kv_lens - (pages - 1) * ps
        nnz = int(self.kv_np[bs])
        self.indices_dev[:nnz].copy_(self.indices_pinned[:nnz], non_blocking=True)
        return nnz

    def build(self, plan: ChunkPlan) -> ChunkPrefillMeta:
        bs = len(plan.req_ids)
        nnz = self._pages(bs, plan.prefix_lens_np + plan.extend_lens_np, plan.page_table_np)
        self.qo_np[0] = 0
        np.cumsum(plan.extend_lens_np, out=self.qo_np[1 : bs + 1])
        total = int(self.qo_pinned[bs])  # ok: FC101
        rows = np.flatnonzero(plan.target_ids_np[:total] >= 0)
        n = len(rows)
        self.rows_np[:n] = rows
        self.targets_np[:n] = plan.target_ids_np[rows]
        spans: Dict[int, Tuple[int, int]] = {}
        for i, rid in enumerate(plan.req_ids):
            a = int(np.searchsorted(rows, self.qo_np[i]))
            b = int(np.searchsorted(rows, self.qo_np[i + 1]))
            spans[rid] = (a, b)
        self.rows_dev[:n].copy_(self.rows_pinned[:n], non_blocking=True)
        self.targets_dev[:n].copy_(self.targets_pinned[:n], non_blocking=True)
        return ChunkPrefillMeta(
            batch_size=bs,
            qo_indptr=self.qo_pinned[: bs + 1].to(self.device, non_blocking=True),
            qo_indptr_cpu=self.qo_pinned[: bs + 1],
            kv_indptr_cpu=self.kv_pinned[: bs + 1],
            kv_indptr_gpu=self.kv_pinned[: bs + 1].to(self.device, non_blocking=True),
            kv_indices=self.indices_dev[:nnz],
            last_page_len_cpu=self.last_pinned[:bs],
            logprob_rows=self.rows_dev[:n],
            logprob_targets=self.targets_dev[:n],
            num_logprob_rows=n,
            row_spans=spans,
        )

    def build_decode(self, seq_lens: List[int], page_table_np: np.ndarray) -> DecodeMeta:
        bs = len(seq_lens)
        nnz = self._pages(bs, np.asarray(seq_lens, dtype=np.int64), page_table_np)
        return DecodeMeta(
            batch_size=bs,
            kv_indptr_cpu=self.kv_pinned[: bs + 1],
            kv_indices=self.indices_dev[:nnz],
            last_page_len_cpu=self.last_pinned[:bs],
        )
