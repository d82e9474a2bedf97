"""Attention for the draft model: graph-mode decode per row bucket, eager decode, root extend."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, Iterable

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from spec_attn.workspaces import make_draft_workspace
from treespec.config import PLAN_STATE_ATTR, SpecConfig
from treespec.tree import RowPageTable

logger = logging.getLogger(__name__)


@dataclass
class DraftStepMeta:
    rows: int
    bucket: int
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor


@dataclass
class RootTable:
    """Root extend: two query tokens per request (deepest accepted leaf, or a pad, then the bonus)."""

    bs: int
    qo_indptr_np: np.ndarray
    kv_indptr_np: np.ndarray
    kv_indices: torch.Tensor
    slots_np: np.ndarray


class DraftDecodeBackend:
    def __init__(self, cfg: SpecConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        max_rows = cfg.max_draft_rows
        max_pages = max_rows * (cfg.max_model_len + cfg.max_depth + 1)
        self.graph_ws = torch.zeros(cfg.graph_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.eager_ws = make_draft_workspace(cfg.draft_ws_bytes(), device)
        self.root_ws = make_draft_workspace(cfg.draft_ws_bytes(), device)
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "HND", use_tensor_cores=True)
        self.root_prefill = BatchPrefillWithPagedKVCacheWrapper(self.root_ws, "HND")

        self.kv_indptr = torch.zeros(max_rows + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(max_rows, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_rows + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_rows, dtype=torch.int32, pin_memory=True)
        self.graph_bufs = {
            "kv_indptr": self.kv_indptr,
            "kv_indices": self.kv_indices,
            "last_page_len": self.last_page_len,
        }
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    @property
    def max_graph_rows(self) -> int:
        return max(self.graph_wrappers) if self.graph_wrappers else 0

    def init_graph_wrappers(self, buckets: Iterable[int]) -> None:
        for rows in buckets:
            self.graph_wrappers[rows] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                "HND",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[: rows + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.last_page_len[:rows],
            )

    def is_planned(self, rows: int) -> bool:
        return getattr(self.graph_wrappers[rows], PLAN_STATE_ATTR, None) is not None  # expect: FC103

    def replay_prepare(self, bucket: int, table: RowPageTable) -> DraftStepMeta:
        n = table.rows
        meta = DraftStepMeta(n, bucket, self.kv_indptr[: bucket + 1], self.kv_indices, self.last_page_len[:bucket])
        self.kv_indptr_host[: n + 1] = torch.from_numpy(table.indptr_np)
        self.kv_indptr_host[n + 1: bucket + 1] = table.nnz
        meta.kv_indptr[: n + 1].copy_(self.kv_indptr_host[: n + 1], non_blocking=True)  # ok: FC104
        meta.kv_indices[: table.nnz].copy_(table.indices_pinned, non_blocking=True)
        self._plan_bucket(bucket)
        # padded rows replay as empty sequences ending where the last real row ends
        meta.kv_indptr[n + 1:] = meta.kv_indptr[n]  # expect: FC104
        return meta

    def _plan_bucket(self, bucket: int) -> None:
        cfg = self.cfg
        self.graph_wrappers[bucket].plan(  # ok: FC102
            self.kv_indptr_host[: bucket + 1],
            self.kv_indices,
            self.last_page_len_host[:bucket],
            cfg.draft_num_heads,
            cfg.draft_num_heads,
            cfg.head_dim,
            1,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )

    def plan_eager(self, table: RowPageTable) -> None:
        cfg = self.cfg
        indptr = torch.tensor(table.indptr_np.tolist(), dtype=torch.int32)
        last = torch.ones(table.rows, dtype=torch.int32)
        self.eager_decode.plan(  # ok: FC102
            indptr,
            table.indices_pinned.to(self.device, non_blocking=True),
            last,
            cfg.draft_num_heads,
            cfg.draft_num_heads,
            cfg.head_dim,
            1,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )

    def plan_root(self, table: RootTable) -> None:
        cfg = self.cfg
        self.root_prefill.plan(
            torch.from_numpy(table.qo_indptr_np),
            torch.from_numpy(table.kv_indptr_np),
            table.kv_indices,
            torch.ones(table.bs, dtype=torch.int32),
            cfg.draft_num_heads,
            cfg.draft_num_heads,
            cfg.head_dim,
            1,
            causal=True,
            q_data_type=cfg.dtype,
        )

    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor, rows: int) -> torch.Tensor:
        w = self.graph_wrappers.get(rows) or self.eager_decode
        return w.run(q, kv_cache)  # ok: FC108

    def run_root(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.root_prefill.run(q, kv_cache)  # expect: FC108


def dummy_root_table(bs: int) -> RootTable:
    """Two query tokens per request over a two-slot context, all on the null slot."""
    qo = np.arange(0, 2 * bs + 1, 2, dtype=np.int32)
    return RootTable(bs, qo, qo.copy(), torch.zeros(2 * bs, dtype=torch.int32).pin_memory(),
                     np.zeros(2 * bs, dtype=np.int64))
