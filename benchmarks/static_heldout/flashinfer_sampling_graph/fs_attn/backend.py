"""Decode wrappers per bucket (graph mode), a sliding-window decode, an eager decode, a prefill."""

import functools
from dataclasses import dataclass
from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from fs_attn.workspace import eager_workspace, graph_workspace, trtllm_prefill_workspace, window_workspace
from fs_attn.wrappers import EagerDecodeWrapper
from fsample import SamplingEngineConfig


@dataclass
class DecodeInputs:
    kv_indptr: torch.Tensor  # device copy, read by the KV append kernel
    kv_indptr_host: torch.Tensor  # pinned
    kv_indices: torch.Tensor  # on the device
    last_page_len_host: torch.Tensor  # pinned
    positions: torch.Tensor  # on the device
    window_indptr_host: torch.Tensor
    window_indices: torch.Tensor
    window_last_page_len_host: torch.Tensor


@dataclass
class PrefillInputs:
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor


class DecodeBackend:
    def __init__(self, cfg: SamplingEngineConfig):
        self.cfg = cfg
        self.device = cfg.device
        self._backend = "fa2"
        self.window_layers = frozenset(cfg.window_layers)
        max_bs = cfg.decode_buckets[-1]
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.graph_ws = graph_workspace(cfg)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                "HND",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
            for bs in cfg.decode_buckets
        }
        # sliding-window layers: their own page tables (the window's pages only)
        self.window_decode = BatchDecodeWithPagedKVCacheWrapper(window_workspace(cfg), "HND")
        self.eager_decode = EagerDecodeWrapper(eager_workspace(cfg.device), "HND")
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(
            trtllm_prefill_workspace(cfg.prefill_workspace_bytes(), cfg.device),
            "HND",
            backend="trtllm-gen" if cfg.use_trtllm_prefill else "fa2",
        )
        self.active_bs = -1

    def _shape(self) -> dict:
        return dict(
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim,
            page_size=self.cfg.page_size,
            q_data_type=torch.bfloat16,
        )

    def plan_bucket(self, bs: int, meta: DecodeInputs) -> None:
        w = self.graph_wrappers[bs]
        n = meta.kv_indices.numel()
        self.kv_indices_buf[:n].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        plan = functools.partial(
            w.plan,
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim,
            page_size=self.cfg.page_size,
            q_data_type=torch.bfloat16,
        )
        plan(meta.kv_indptr, self.kv_indices_buf[:n], meta.last_page_len_host)  # expect: FC102
        self.window_decode.plan(
            meta.window_indptr_host,
            meta.window_indices,
            meta.window_last_page_len_host,
            window_left=self.cfg.sliding_window - 1,
            **self._shape(),
        )
        self.active_bs = bs

    def plan_eager(self, meta: DecodeInputs) -> None:
        self.eager_decode.plan(meta.kv_indptr_host, meta.kv_indices, meta.last_page_len_host, **self._shape())  # ok: FC102
        self.window_decode.plan(
            meta.window_indptr_host,
            meta.window_indices,
            meta.window_last_page_len_host,
            window_left=self.cfg.sliding_window - 1,
            **self._shape(),
        )
        self.active_bs = -1

    def plan_prefill(self, meta: PrefillInputs) -> None:
        self.prefill.plan(  # ok: FC102
            meta.qo_indptr_host,
            meta.kv_indptr_host,
            meta.kv_indices,
            meta.last_page_len_host,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        if layer_id in self.window_layers:
            return self.window_decode.run(q, kv_cache[layer_id])  # expect: FC108
        w = self.eager_decode if self.active_bs < 0 else self.graph_wrappers[self.active_bs]
        return w.run(q, kv_cache[layer_id])  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.prefill.run(q, kv_cache[layer_id])

    def workspace_bytes(self) -> int:
        return sum(w._float_workspace_buffer.numel() for w in self.graph_wrappers.values())  # expect: FC103

    def describe(self) -> dict:
        return {"backend": self._backend, "buckets": sorted(self.graph_wrappers)}  # ok: FC103
