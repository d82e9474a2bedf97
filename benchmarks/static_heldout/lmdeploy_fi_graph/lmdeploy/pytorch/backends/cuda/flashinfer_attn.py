"""FlashInfer attention for a PyTorch engine, shaped like LMDeploy's backends/cuda attention + graph buffers."""

import functools
import math
from typing import Dict, Protocol

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)


class PlanReceiver(Protocol):
    def plan(self, *args, **kwargs) -> None: ...


class HostBuffer:
    """Descriptor: a pinned host buffer per instance, created on first access."""

    def __set_name__(self, owner, name):
        self.name = "_host_" + name

    def __get__(self, obj, objtype=None) -> torch.Tensor:
        if obj is None:
            return self
        if not hasattr(obj, self.name):
            setattr(obj, self.name, torch.zeros(obj.max_batches + 1, dtype=torch.int32, pin_memory=True))
        return getattr(obj, self.name)


def _alloc_workspace(nbytes: int, device, zero_init: bool = False) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    if zero_init:
        buf.zero_()
    return buf


def _alloc_zeroed(nbytes: int, device) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    buf.fill_(0)
    return buf


def patched_plan(w, indptr, indices, last_page_len, *args, **kwargs):
    layout = w._kv_layout  # expect: FC103
    return w.plan(indptr, indices, last_page_len, *args, kv_layout=layout, **kwargs)


class FlashInferAttentionMetadataBuilder:
    WORKSPACE_BYTES = 512 * 1024 * 1024
    decode_backend = "trtllm-gen"
    kv_indptr_host = HostBuffer()

    def __init__(self, max_batches: int, max_prefill_token_num: int, num_heads: int, head_dim: int, device):
        self.max_batches = max_batches
        self.device = device
        self.num_heads, self.head_dim = num_heads, head_dim
        prefill_ws = torch.empty(max_prefill_token_num * num_heads * head_dim * 4, dtype=torch.uint8, device=device)  # ok: FC106
        decode_ws = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        trt_ws = _alloc_workspace(max_batches * num_heads * 8192, device)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_ws, "NHD")
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(decode_ws, "NHD")
        self.trt_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(trt_ws, "HND", backend=self.decode_backend)
        self.fa2_wrapper = BatchDecodeWithPagedKVCacheWrapper(_alloc_zeroed(max_batches * num_heads * 4096, device), "HND", backend="fa2")
        self.kv_indptr = torch.zeros(max_batches + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_batches * 4096, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_batches, dtype=torch.int32, device=device)
        self.kv_last_page_len_host = torch.ones(max_batches, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        self.block_offsets_buf: Dict[int, torch.Tensor] = {}
        self._plan_info = None
        self._shim = functools.partial(patched_plan, self.decode_wrapper)

    def _plan_decode(self, wrapper: PlanReceiver, bs: int, page_size: int):
        plan_kwargs = dict(
            indptr=self.kv_indptr[: bs + 1],
            indices=self.kv_indices,
            last_page_len=self.kv_last_page_len_host[:bs],
            num_qo_heads=self.num_heads,
            num_kv_heads=self.num_heads,
            head_dim=self.head_dim,
            page_size=page_size,
        )
        wrapper.plan(**plan_kwargs)  # expect: FC102
        self._plan_info = (bs, page_size)  # ok: FC103

    def build(self, seq_lens: torch.Tensor, block_offsets: torch.Tensor, page_size: int):
        bs, *_ = seq_lens.shape
        num_pages = (seq_lens + page_size - 1) // page_size
        self.kv_indptr[1 : bs + 1] = torch.cumsum(num_pages, 0)  # ok: FC104
        max_pages = math.ceil(seq_lens.max() / page_size)  # expect: FC101
        used = torch.unique(block_offsets[:, :max_pages])  # expect: FC101
        self.kv_indices[: used.numel()].copy_(used)
        self._plan_decode(self.decode_wrapper, bs, page_size)
        self._shim(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices, self.kv_last_page_len_host[:bs], self.num_heads,
            self.num_heads, self.head_dim, page_size,
        )
        return bs

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        if bs in self.graph_wrappers:
            return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108
        if q.shape[0] > bs:
            return self.prefill_wrapper.run(q, kv_cache)  # expect: FC108
        return self.trt_decode_wrapper.run(q, kv_cache)  # expect: FC108
