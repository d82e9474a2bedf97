"""Decode graphs per bucket on CUDAGraph wrappers, a shared-prefix cascade, an admission prefill."""

import functools
from typing import Dict

import torch
from flashinfer import (
    BatchPrefillWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)

from kb_attn.records import Admission, FIMeta
from kb_attn.workspace import admission_workspace, cascade_workspace, decode_workspace
from kvbatch.config import CACHED_MODULE_ATTR, BatcherConfig


def prefill_kwargs(cfg: BatcherConfig) -> dict:
    kw = {"kv_layout": cfg.kv_layout}
    if cfg.use_trtllm_prefill:
        kw["backend"] = "trtllm-gen"
    return kw


def describe_wrapper(self) -> Dict[str, str]:
    """Bound onto a wrapper for the status page."""
    return {"kind": type(self).__name__, "layout": self._kv_layout}  # expect: FC103


class BatcherBackend:
    def __init__(self, cfg: BatcherConfig):
        self.cfg = cfg
        self.device = cfg.device
        max_bs = cfg.decode_buckets[-1]
        self.indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.graph_ws = decode_workspace(cfg.device)
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        # rows that share the system prompt read it once through a two-level cascade
        self.cascade = MultiLevelCascadeAttentionWrapper(2, cascade_workspace(cfg), cfg.kv_layout)
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(admission_workspace(cfg), **prefill_kwargs(cfg))
        self._prefill_plan = functools.partial(self.prefill.plan, causal=True, q_data_type=torch.bfloat16)
        self.prefix_qo_host = torch.zeros(2, dtype=torch.int32, pin_memory=True)
        self.unique_qo_host = torch.arange(max_bs + 1, dtype=torch.int32).pin_memory()
        self.prefix_kv_indptr_host = torch.zeros(2, dtype=torch.int32, pin_memory=True)
        self.prefix_last_host = torch.ones(1, dtype=torch.int32, pin_memory=True)
        self.prefix_indices = torch.zeros(cfg.prefix_pages_max, dtype=torch.int32, device=self.device)
        self.shared_prefix_rows = 0
        self.active_bs = max_bs

    def init_graph_wrappers(self) -> None:
        for bs in self.cfg.decode_buckets:
            self.graph_wrappers[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                self.indptr_buf[: bs + 1],
                self.indices_buf,
                self.last_page_len_buf[:bs],
                self.cfg.kv_layout,
            )

    def jit_ready(self) -> bool:
        return all(hasattr(w, CACHED_MODULE_ATTR) for w in self.graph_wrappers.values())  # expect: FC103

    def _heads(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def plan_bucket(self, meta: FIMeta) -> None:
        w = self.graph_wrappers[meta.padded]
        w.plan(meta.kv_indptr_host, meta.kv_indices, meta.last_page_len_host, *self._heads())  # ok: FC102
        if self.shared_prefix_rows:
            self._plan_cascade(meta)
        self.active_bs = meta.padded

    def _plan_cascade(self, meta: FIMeta) -> None:
        self.prefix_qo_host[1] = meta.padded
        self.cascade.plan(  # ok: FC102
            [self.prefix_qo_host, self.unique_qo_host[: meta.padded + 1]],
            [self.prefix_kv_indptr_host, meta.kv_indptr_host],
            [self.prefix_indices, meta.kv_indices],
            [self.prefix_last_host, meta.last_page_len_host],
            *self._heads(),
        )

    def plan_admission(self, adm: Admission) -> None:
        self._prefill_plan(  # expect: FC102
            adm.qo_indptr,
            adm.kv_indptr_host,
            adm.kv_indices,
            adm.last_page_len_host,
            *self._heads(),
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        if self.shared_prefix_rows:
            return self.cascade.run(q, kv_cache[layer_id])  # expect: FC108
        return self.graph_wrappers[self.active_bs].run(q, kv_cache[layer_id])  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.prefill.run(q, kv_cache[layer_id])
