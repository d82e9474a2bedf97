"""FlashInfer attention for the reasoning engine: decode graphs per bucket, a paged prefill."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from reasoning.config import ReasoningConfig
from rb_attn.workspace import eager_workspace, prefill_workspace


@dataclass
class BatchMeta:
    batch_size: int
    num_pages: int
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_cpu: torch.Tensor
    kv_indices: torch.Tensor


class ReasoningAttnBackend:
    GRAPH_WORKSPACE_BYTES = 192 << 20

    def __init__(self, cfg: ReasoningConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._backend = "fa2"  # ok: FC103
        max_bs = cfg.largest_bucket
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_device = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_workspace = torch.zeros(self.GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in cfg.buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_device[:bs],
            )
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(eager_workspace(cfg, device), "NHD")
        # scores "would the model end its thinking here" on a summary head, beside the main decode
        self.probe_decode = BatchDecodeWithPagedKVCacheWrapper(eager_workspace(cfg, device), "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(cfg, device), "NHD")
        self.cur_bs: Optional[int] = None
        self.probe_out: Optional[torch.Tensor] = None

    @property
    def heads(self) -> tuple:
        return (self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size)

    def plan_bucket(self, bs: int, meta: BatchMeta) -> None:
        plan = self.graph_wrappers[bs].plan
        plan(self.kv_indptr_host[: bs + 1], meta.kv_indices, self.last_page_device[:bs], *self.heads)  # expect: FC102
        self.cur_bs = bs

    def plan_eager(self, meta: BatchMeta) -> None:
        self.eager_decode.plan(meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_cpu, *self.heads)  # ok: FC102
        if self.cfg.probe_end_of_thinking:
            self.probe_decode.plan(meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_cpu, 1, 1,
                                   self.cfg.head_dim, self.cfg.page_size)
        self.cur_bs = None

    def init_forward_metadata(self, meta: BatchMeta) -> None:
        self.prefill_wrapper.plan(  # ok: FC102
            meta.qo_indptr_cpu, meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_cpu, *self.heads, causal=True
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.last_page_host[:bs] = 1
        self.graph_wrappers[bs].plan(self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.last_page_host[:bs],
                                     *self.heads)
        self.cur_bs = bs

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: BatchMeta) -> None:
        real_bs = meta.batch_size
        self.kv_indices_buf[: meta.num_pages].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        self.kv_indptr_host[: real_bs + 1].copy_(meta.kv_indptr_cpu)
        self.kv_indptr_host[real_bs + 1 : bs + 1] = meta.num_pages
        self.last_page_host[:real_bs].copy_(meta.last_page_cpu)
        self.last_page_host[real_bs:bs] = 1
        self.last_page_device[:bs].copy_(self.last_page_host[:bs], non_blocking=True)
        self.plan_bucket(bs, meta)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.cur_bs is not None:
            w = self.graph_wrappers[self.cur_bs]
        else:
            w = self.eager_decode
        out = w.run(q, kv_cache)  # ok: FC108
        if self.cfg.probe_end_of_thinking:
            self.probe_out = self.probe_decode.run(q[:, :1].contiguous(), kv_cache)  # expect: FC108
        return out

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    def describe(self) -> dict:
        return {
            "backend": self._backend,
            "prefill_rows": vars(self.prefill_wrapper).get("_max_total_num_rows"),  # expect: FC103
        }
