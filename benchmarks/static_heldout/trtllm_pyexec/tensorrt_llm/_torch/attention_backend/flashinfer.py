from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from .interface import AttentionMetadata


@dataclass(frozen=True)
class PlanParams:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_dtype: torch.dtype


@dataclass
class FlashInferWrappers:
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper]


def share_graph_buffers(dst, src):
    for name in ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf"):
        setattr(dst, name, getattr(src, name))  # expect: FC103


@dataclass(kw_only=True)
class FlashInferAttentionMetadata(AttentionMetadata):
    page_size: int = 32
    workspace_buffer: Optional[torch.Tensor] = None
    kv_lens_cuda: Optional[torch.Tensor] = None
    _plan_params_to_wrappers: Dict[PlanParams, FlashInferWrappers] = field(default_factory=dict)

    def __post_init__(self):
        if self.workspace_buffer is None:
            self.workspace_buffer = torch.empty(320 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # expect: FC106
        with torch.device("cuda"):
            self._qo_indptr = torch.zeros(self.max_num_requests + 1, dtype=torch.int32)
            self._paged_kv_indptr_decode = torch.zeros(self.max_num_requests + 1, dtype=torch.int32)
            self._paged_kv_indices = torch.zeros(self.max_num_tokens, dtype=torch.int32)
            self._paged_kv_last_page_len = torch.ones(self.max_num_requests, dtype=torch.int32)
        self._paged_kv_indptr_host = torch.zeros(self.max_num_requests + 1, dtype=torch.int32, pin_memory=True)
        self._paged_kv_last_page_len_host = torch.ones(self.max_num_requests, dtype=torch.int32, pin_memory=True)
        self._block_tables = None

    @property
    def paged_kv_indptr_decode(self) -> torch.Tensor:
        return self._paged_kv_indptr_decode

    def get_plan_params(self, num_heads: int, num_kv_heads: int, head_dim: int, q_dtype: torch.dtype) -> PlanParams:
        assert head_dim in (64, 128, 256), f"unsupported head_dim {head_dim}"  # expect: FC109
        params = PlanParams(num_heads, num_kv_heads, head_dim, q_dtype)
        if params not in self._plan_params_to_wrappers:  # ok: FC103
            self._plan_params_to_wrappers[params] = self._build_wrappers()
        return params

    def _build_wrappers(self) -> FlashInferWrappers:
        if self.is_cuda_graph:
            decode = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace_buffer,
                "HND",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self._paged_kv_indptr_decode[: self.max_num_requests + 1],
                paged_kv_indices_buffer=self._paged_kv_indices,
                paged_kv_last_page_len_buffer=self._paged_kv_last_page_len,
            )
        else:
            decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, "HND")
        prefill = None if self.is_cuda_graph else BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, "HND")
        if self._plan_params_to_wrappers:
            share_graph_buffers(decode, next(iter(self._plan_params_to_wrappers.values())).decode_wrapper)
        return FlashInferWrappers(decode, prefill)

    def prepare(self):
        n = self.num_seqs
        assert self.num_contexts <= n  # ok: FC109
        num_ctx_tokens = int(self.seq_lens[: self.num_contexts].sum())  # ok: FC101
        if self.kv_lens_cuda is None or self.kv_lens_cuda.numel() < n:
            self.kv_lens_cuda = torch.empty(n, dtype=torch.int32, device="cuda")  # expect: FC107
        if self._block_tables is None:
            self._block_tables = torch.zeros(self.max_num_requests, 1024, dtype=torch.int32, device="cuda")  # ok: FC107
        self.kv_lens_cuda[:n].copy_(self.seq_lens_kv, non_blocking=True)
        self._qo_indptr[1 : n + 1] = torch.cumsum(self.seq_lens.cuda(), 0)
        self._paged_kv_last_page_len_host[:n] = (self.seq_lens_kv - 1) % self.page_size + 1
        self._paged_kv_last_page_len[:n].copy_(self._paged_kv_last_page_len_host[:n], non_blocking=True)  # ok: FC104
        total_q = self._qo_indptr[n].item()  # expect: FC101
        torch.cumsum((self.seq_lens_kv + self.page_size - 1) // self.page_size, 0, out=self._paged_kv_indptr_host[1 : n + 1])
        for params in self._plan_params_to_wrappers:
            self._plan_with_params(params)
        torch.cumsum(self.kv_lens_cuda[:n] // self.page_size, 0, out=self._paged_kv_indptr_decode[1 : n + 1])  # expect: FC104
        return num_ctx_tokens, total_q

    def _plan_with_params(self, plan_params: PlanParams):
        wrappers = self._plan_params_to_wrappers[plan_params]
        n = self.num_generations
        w = wrappers.decode_wrapper
        w.plan(self._paged_kv_indptr_host[: n + 1], self._paged_kv_indices, self._paged_kv_last_page_len_host[:n], plan_params.num_heads, plan_params.num_kv_heads, plan_params.head_dim, self.page_size, q_data_type=plan_params.q_dtype)  # ok: FC102
        if wrappers.prefill_wrapper is not None and self.num_contexts > 0:
            ctx = wrappers.prefill_wrapper
            ctx.plan(self._qo_indptr[: self.num_contexts + 1], self._paged_kv_indptr_host[: self.num_contexts + 1], self._paged_kv_indices, self._paged_kv_last_page_len[: self.num_contexts], plan_params.num_heads, plan_params.num_kv_heads, plan_params.head_dim, self.page_size)  # expect: FC102
        if self.is_cuda_graph:
            w.__dict__["_fixed_batch_size"] = n  # expect: FC103

    def dump_plan(self, params: PlanParams):
        w = self._plan_params_to_wrappers[params].decode_wrapper
        return {"plan_info": vars(w)["_plan_info"], "layout": w._kv_layout}  # expect: FC103


class FlashInferAttention:
    def __init__(self, layer_idx, num_heads, head_dim, num_kv_heads):
        self.layer_idx = layer_idx
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_kv_heads = num_kv_heads

    def forward(self, q, kv_cache, metadata: FlashInferAttentionMetadata, num_extra_kv_tokens: int = 0):
        params = metadata.get_plan_params(self.num_heads, self.num_kv_heads, self.head_dim, q.dtype)
        wrappers = metadata._plan_params_to_wrappers[params]  # ok: FC103
        if num_extra_kv_tokens:
            metadata.paged_kv_indptr_decode[1 : metadata.num_generations + 1] += num_extra_kv_tokens  # expect: FC104
        out = wrappers.decode_wrapper.run(q[metadata.num_contexts :], kv_cache)  # ok: FC108
        return out
