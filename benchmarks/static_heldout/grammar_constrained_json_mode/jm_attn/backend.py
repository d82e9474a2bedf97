"""Decode attention for JSON mode: graph-mode wrappers per bucket, a schema-prefix cascade, jump-forward prefill."""
from __future__ import annotations

from typing import Dict

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)

from jsonmode import JsonModeConfig

from .meta import DecodeMeta
from .workspace import eager_workspace, jump_forward_workspace


class JsonBackend:
    def __init__(self, cfg: JsonModeConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        mb = cfg.max_batch
        self.graph_workspace = torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.kv_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages_per_step, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(mb, dtype=torch.int32, device=device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
            for bs in cfg.buckets
        }
        self.eager = BatchDecodeWithPagedKVCacheWrapper(
            eager_workspace(cfg.eager_workspace_bytes(), device.index or 0),
            "NHD",
            backend="trtllm-gen" if cfg.use_trtllm_eager else "fa2",
        )
        self.schema_cascade = MultiLevelCascadeAttentionWrapper(2, self.graph_workspace, "NHD")
        self.jump = BatchPrefillWithPagedKVCacheWrapper(jump_forward_workspace(device), "NHD")
        self.schema_indptr_host = torch.zeros(2, dtype=torch.int32, pin_memory=True)
        self.schema_last_host = torch.ones(1, dtype=torch.int32, pin_memory=True)
        self.schema_indices = torch.zeros(cfg.max_pages_per_step, dtype=torch.int32, device=device)
        self.bs = 0
        self.shared_schema = False

    def init_graph_buffers(self) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104

    @property
    def dims(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def plan_capture(self, bs: int) -> None:
        self.graph_wrappers[bs].plan(torch.arange(bs + 1, dtype=torch.int32), self.kv_indices[:bs],
                                     torch.ones(bs, dtype=torch.int32), *self.dims)
        self.bs = bs

    def plan_bucket(self, bs: int, meta: DecodeMeta) -> None:
        w = self.graph_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"wrapper for bucket {bs} was built for another batch size")
        w.plan(meta.kv_indptr_host, meta.kv_indices, meta.kv_last_page_len,  # expect: FC102
               *self.dims)
        self.bs = bs

    def prepare_replay(self, bs: int, meta: DecodeMeta) -> None:
        n = meta.batch_size
        self.kv_indices[: meta.num_pages].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        self.plan_bucket(bs, meta)
        if self.shared_schema:
            qo_top = torch.tensor([0, n], dtype=torch.int32)
            qo = torch.arange(n + 1, dtype=torch.int32)
            self.schema_cascade.plan([qo_top, qo], [self.schema_indptr_host, meta.kv_indptr_host],  # ok: FC102
                                     [self.schema_indices, meta.kv_indices],
                                     [self.schema_last_host, meta.kv_last_page_len_host], *self.dims)
        if n < bs:
            self.kv_indptr[n + 1 : bs + 1].fill_(meta.num_pages)  # expect: FC104

    def plan_eager(self, meta: DecodeMeta) -> None:
        self.eager.plan(meta.kv_indptr_host, meta.kv_indices, meta.kv_last_page_len_host, *self.dims)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        out = self.graph_wrappers[self.bs].run(q, kv_cache)  # ok: FC108
        if self.shared_schema:
            out = self.schema_cascade.run(q, kv_cache)  # expect: FC108
        return out

    def forward_eager(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.eager.run(q, kv_cache)

    def jump_forward(self, q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr_host: torch.Tensor,
                     meta: DecodeMeta) -> torch.Tensor:
        self.jump.plan(qo_indptr_host, meta.kv_indptr_host, meta.kv_indices, meta.kv_last_page_len_host,
                       *self.dims, causal=True)
        return self.jump.run(q, kv_cache)
