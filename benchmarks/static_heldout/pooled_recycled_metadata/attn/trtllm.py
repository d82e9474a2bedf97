"""trtllm-gen decode: graph wrappers per bucket on a pooled workspace, an eager wrapper, an MTP draft wrapper and the
direct kernel for batches past the last bucket."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from poolserve.config import ServeConfig
from poolserve.metadata import ForwardBatch, StepMetadata
from poolserve.pools import TensorPool, zeroed_workspace


class TrtllmGenDecode:
    def __init__(self, cfg: ServeConfig, pool: TensorPool, device: torch.device):
        self.cfg, self.pool, self.device = cfg, pool, device
        self._backend = "trtllm-gen"  # ok: FC103
        max_bs, i32 = cfg.max_batch_size, dict(dtype=torch.int32, device=device)
        self.block_indptr = torch.zeros(max_bs + 1, **i32)
        self.block_ids = torch.zeros(cfg.max_pages, **i32)
        self.block_last_len = torch.empty(max_bs, **i32)
        self.block_last_len.fill_(1)  # ok: FC104
        self.indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.draft_lens = torch.zeros(max_bs, **i32)
        ws_bytes = cfg.split_kv_workspace_bytes()
        self.graph_workspace = pool.acquire(ws_bytes, torch.uint8)
        eager_ws = torch.zeros(ws_bytes // 4, dtype=torch.uint8, device=device)  # ok: FC105
        self.eager_wrapper = BatchDecodeWithPagedKVCacheWrapper(eager_ws, "NHD", backend=self._backend)
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(zeroed_workspace(pool, ws_bytes // 4), "NHD", backend="trtllm-gen")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.direct_workspace: Optional[torch.Tensor] = None
        self.block_tables: Optional[torch.Tensor] = None

    def init_wrappers(self) -> None:
        if self.cfg.decode_backend != "trtllm-gen":
            return
        for bs in self.cfg.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "NHD", use_cuda_graph=True, backend="trtllm-gen",
                paged_kv_indptr_buffer=self.block_indptr[: bs + 1], paged_kv_indices_buffer=self.block_ids,
                paged_kv_last_page_len_buffer=self.block_last_len[:bs])

    def plan_eager(self, batch: ForwardBatch) -> None:
        self.eager_wrapper.plan(batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, *self.cfg.plan_dims())  # ok: FC102

    def plan_capture(self, bs: int) -> None:
        self.indptr_cpu[: bs + 1] = 0
        self.graph_wrappers[bs].plan(self.indptr_cpu[: bs + 1], self.block_ids, self.last_len_cpu[:bs], *self.cfg.plan_dims())  # ok: FC102

    def plan_bucket(self, bs: int, batch: ForwardBatch) -> None:
        raw_bs = batch.batch_size
        need = batch.kv_indptr[raw_bs].item()  # expect: FC101
        if need > self.block_ids.numel():
            self.block_ids.resize_(2 * need)  # expect: FC107
        self.block_ids[:need].copy_(batch.kv_indices[:need], non_blocking=True)  # ok: FC104
        self.indptr_cpu[: raw_bs + 1] = batch.kv_indptr_cpu
        self.indptr_cpu[raw_bs + 1 : bs + 1] = need
        self.last_len_cpu[:raw_bs] = batch.kv_last_page_len_cpu
        self.last_len_cpu[raw_bs:bs] = 1
        self.graph_wrappers[bs].plan(self.indptr_cpu[: bs + 1], self.block_ids, self.last_len_cpu[:bs], *self.cfg.plan_dims())  # ok: FC102
        self.block_indptr[raw_bs + 1 : bs + 1] = self.block_indptr[raw_bs]  # expect: FC104

    def plan_draft(self, meta: StepMetadata) -> None:
        setattr(self, "draft_lens", meta.seq_lens.clone())  # expect: FC107
        args = (meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len)
        self.draft_wrapper.plan(*args, *self.cfg.plan_dims())  # expect: FC102

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        w = self.graph_wrappers.get(meta.bucket) or self.eager_wrapper
        return w.run(q, kv_cache)  # ok: FC108

    def forward_draft(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        out = self.draft_wrapper.run(q, kv_cache)  # expect: FC108
        return out * (self.draft_lens[: q.shape[0], None, None] > 0)  # ok: FC101

    def decode_direct(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        if self.direct_workspace is None:
            self.direct_workspace = torch.empty(self.cfg.split_kv_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105
        if self.block_tables is None:
            shape = (self.cfg.max_batch_size * 4, self.cfg.max_pages // self.cfg.max_batch_size)
            self.block_tables = torch.zeros(shape, dtype=torch.int32, device=self.device)  # ok: FC107
        live = torch.where(meta.seq_lens > 0)[0]  # expect: FC101
        cols = torch.arange(self.block_tables.shape[1], device=self.device)
        idx = (meta.kv_indptr[:-1, None] + cols).clamp_(max=meta.kv_indices.numel() - 1)
        tables = self.block_tables[: meta.seq_lens.shape[0]]  # ok: FC101
        tables.copy_(torch.where(cols < (meta.kv_indptr[1:] - meta.kv_indptr[:-1])[:, None], meta.kv_indices[idx], 0))  # ok: FC101
        out = trtllm_batch_decode_with_kv_cache(q[live], kv_cache, self.direct_workspace, tables[live], meta.seq_lens[live],
                                                meta.max_seq_len, bmm1_scale=self.cfg.head_dim**-0.5, bmm2_scale=1.0)
        return torch.zeros_like(q).index_copy_(0, live, out)

    def reset_bucket(self) -> None:
        self.block_ids.zero_()  # expect: FC104
