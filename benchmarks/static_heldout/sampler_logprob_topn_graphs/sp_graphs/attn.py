"""Decode attention: graph-mode wrappers per bucket plus attention to each request's sink pages."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import ClassVar, Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state
from flashinfer.decode import fast_decode_plan


@dataclass
class BackendLimits:
    max_batch: int = 128
    max_pages: int = 65536
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    sink_pages: int = 1
    max_prefill_tokens: int = 8192
    graph_workspace_bytes: int = 128 << 20
    buckets: Tuple[int, ...] = field(default_factory=lambda: (1, 2, 4, 8, 16, 32, 64, 128))
    EAGER_WORKSPACE_BYTES: ClassVar[int] = 256 << 20


def _layout_of(target) -> str:
    return target._kv_layout  # expect: FC103


def make_sink_wrapper(workspace: torch.Tensor) -> BatchDecodeWithPagedKVCacheWrapper:
    return BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")


class SinkAttention:
    """The first pages of every request (attention sinks), attended apart and merged by LSE."""

    def __init__(self, wrapper: BatchDecodeWithPagedKVCacheWrapper, limits: BackendLimits, device: torch.device):
        self.wrapper = wrapper
        self.limits = limits
        self.sink_indices = torch.zeros(limits.max_batch * limits.sink_pages, dtype=torch.int32, device=device)

    def set_sink_pages(self, row: int, pages: np.ndarray) -> None:
        sp = self.limits.sink_pages
        self.sink_indices[row * sp : (row + 1) * sp].copy_(torch.from_numpy(pages[:sp].astype(np.int32)))

    def plan(self, n: int) -> None:
        lim = self.limits
        indptr = torch.arange(n + 1, dtype=torch.int32) * lim.sink_pages
        last = torch.full((n,), lim.page_size, dtype=torch.int32)
        self.wrapper.plan(indptr, self.sink_indices[: n * lim.sink_pages], last, lim.num_qo_heads,
                          lim.num_kv_heads, lim.head_dim, lim.page_size)

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor):
        return self.wrapper.run_return_lse(q, kv_cache)  # expect: FC108


class DecodeBackend:
    def __init__(self, limits: BackendLimits, device: torch.device):
        self.limits = limits
        max_bs = limits.max_batch
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(limits.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.graph_workspace = torch.zeros(limits.graph_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.eager_workspace = torch.zeros(limits.EAGER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        prefill_bytes = limits.max_prefill_tokens * limits.num_qo_heads * limits.head_dim * 8
        self.prefill_workspace = torch.empty(prefill_bytes, dtype=torch.uint8, device=device)  # ok: FC105

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
            for bs in limits.buckets
        }
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.sink = SinkAttention(make_sink_wrapper(self.eager_workspace), limits, device)
        self.plan_kw = dict(num_qo_heads=limits.num_qo_heads, num_kv_heads=limits.num_kv_heads,
                            head_dim=limits.head_dim, page_size=limits.page_size)
        self._kv_layout = "NHD"
        self.layout_of_prefill = functools.partial(_layout_of, self.prefill)
        self.bucket: Optional[int] = None

    def check_layouts(self) -> None:
        if self.layout_of_prefill() != self._kv_layout:  # ok: FC103
            raise RuntimeError("prefill wrapper and decode graphs disagree on the KV layout")

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices[:bs], self.last_page_len_host[:bs], **self.plan_kw
        )
        self.sink.plan(bs)
        self.bucket = bs

    def plan_bucket(self, bs: int, n: int, indptr_np: np.ndarray, indices: torch.Tensor) -> None:
        nnz = int(indptr_np[-1])
        self.kv_indptr_host[: n + 1] = torch.from_numpy(indptr_np)
        self.kv_indptr_host[n + 1 : bs + 1] = nnz
        self.kv_indices[:nnz].copy_(indices, non_blocking=True)  # ok: FC104
        plan_fn = functools.partial(fast_decode_plan, self.graph_wrappers[bs])
        # last-page lengths live on the device: the decode loop advances them after each step
        plan_fn(self.kv_indptr_host[: bs + 1], self.kv_indices[:nnz], self.kv_last_page_len[:bs], **self.plan_kw)  # expect: FC102
        self.sink.plan(n)
        self.bucket = bs

    def plan_prefill(self, qo_indptr_np: np.ndarray, kv_indptr_np: np.ndarray, indices: torch.Tensor,
                     last_page_len_np: np.ndarray) -> None:
        lim = self.limits
        self.prefill.plan(
            torch.from_numpy(qo_indptr_np), torch.from_numpy(kv_indptr_np), indices,
            torch.from_numpy(last_page_len_np), lim.num_qo_heads, lim.num_kv_heads, lim.head_dim,
            lim.page_size, causal=True,
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        out, lse = self.graph_wrappers[self.bucket].run_return_lse(q, kv_cache)  # ok: FC108
        sink_out, sink_lse = self.sink.run(q, kv_cache)
        merged, _ = merge_state(out, lse, sink_out, sink_lse)
        return merged

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv_cache)
