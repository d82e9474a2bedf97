"""Plain decode (no draft found for any row): graph-mode wrappers per bucket, an eager one past them."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from lookahead import LookaheadConfig
from la_attn.batch import LookaheadBatch
from la_attn.workspace import VerifyWorkspaces


class DecodeBackend:
    def __init__(self, cfg: LookaheadConfig, workspaces: VerifyWorkspaces, device: torch.device):
        self.cfg, self.device = cfg, device
        kw = dict(backend="trtllm-gen")
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(workspaces.eager_decode, "NHD", **kw)
        self.graph_workspace = workspaces.graph
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.indptr_pinned = torch.zeros(cfg.max_graph_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_pinned = torch.ones(cfg.max_graph_bs, dtype=torch.int32, pin_memory=True)

    def _heads(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def init_cuda_graph_state(self) -> None:
        c, dev = self.cfg, self.device
        self.kv_indptr_buf = torch.zeros(c.max_graph_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices_buf = torch.zeros(c.max_graph_bs * c.max_pages_per_seq, dtype=torch.int32, device=dev)
        self.kv_last_page_len_buf = torch.zeros(c.max_graph_bs, dtype=torch.int32, device=dev)
        self.kv_last_page_len_buf.fill_(1)  # ok: FC104
        for bs in c.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.kv_last_page_len_buf[:bs],
                backend="trtllm-gen",
            )

    def plan_eager(self, batch: LookaheadBatch) -> None:
        self.eager_decode.plan(batch.kv_indptr_cpu, batch.kv_indices, batch.last_page_len_cpu, *self._heads())

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        last_cpu = torch.ones(bs, dtype=torch.int32)
        self.graph_wrappers[bs].plan(indptr_cpu, self.kv_indices_buf[:bs], last_cpu, *self._heads())  # ok: FC102

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: LookaheadBatch) -> None:
        n, nnz = batch.num_rows, batch.nnz
        self.kv_indices_buf[:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self.indptr_pinned[: n + 1].copy_(batch.kv_indptr_cpu)
        self.indptr_pinned[n + 1 : bs + 1] = nnz
        self.last_page_len_pinned[:n].copy_(batch.last_page_len_cpu)
        self.last_page_len_pinned[n:bs] = 1
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.indptr_pinned[: bs + 1], self.kv_indices_buf[:nnz], self.last_page_len_pinned[:bs], *self._heads()
        )
        torch.cumsum(batch.page_counts, 0, dtype=torch.int32, out=self.kv_indptr_buf[1 : n + 1])  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        w = self.graph_wrappers[bs] if bs is not None else self.eager_decode
        return w.run(q, kv_cache)
