"""FlashInfer backend of the PyTorch flow: metadata that plans one wrapper set per PlanParams, and the op."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional

import flashinfer
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from .interface import AttentionMetadata, PlanParams

# scratch shared by every wrapper of one metadata object, in MiB
_WORKSPACE_MB = int(os.environ.get("TRTLLM_FLASHINFER_WORKSPACE_MB", "320"))


class FlashInferWrappers(NamedTuple):
    decode: BatchDecodeWithPagedKVCacheWrapper
    prefill: BatchPrefillWithPagedKVCacheWrapper


@dataclass(kw_only=True)
class FlashInferAttentionMetadata(AttentionMetadata):
    kv_layout: str = "HND"
    page_size: int = 32
    use_trtllm_gen: bool = False
    is_cross: bool = False
    cross_params: Optional[PlanParams] = None
    workspace_buffer: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._wrappers: Dict[PlanParams, FlashInferWrappers] = {}
        self._planned: set = set()
        # our own record of what each plan was made for: (contexts, generations)
        self._plan_info: Dict[PlanParams, tuple] = {}  # ok: FC103
        self._post_init_with_buffers()

    def _post_init_with_buffers(self) -> None:
        if self.workspace_buffer is None:
            self.workspace_buffer = torch.empty(_WORKSPACE_MB << 20, dtype=torch.uint8, device="cuda")  # expect: FC105, FC106
        n = self.max_num_requests
        max_pages = self.max_num_tokens // self.page_size + n
        self.qo_indptr_cuda = torch.zeros(n + 1, dtype=torch.int32, device="cuda")
        self.qo_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_indptr_decode = torch.zeros(n + 1, dtype=torch.int32, device="cuda")
        self.paged_kv_indptr_decode_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_indptr_prefill_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self._paged_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device="cuda")
        self._paged_kv_last_page_len = torch.ones(n, dtype=torch.int32, device="cuda")
        self._paged_kv_last_page_len_host = torch.ones(n, dtype=torch.int32, pin_memory=True)
        if self.is_cross:
            # encoder-decoder models: cross attention over the (ragged) encoder output
            cross_bytes = self.max_num_tokens * 64 * 1024
            self.cross_workspace = torch.empty(cross_bytes, dtype=torch.uint8, device="cuda")  # ok: FC105, FC106
            self.cross_wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self.cross_workspace, "NHD")
            self.cross_qo_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
            self.enc_kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
            self.enc_kv_indptr_cuda = torch.zeros(n + 1, dtype=torch.int32, device="cuda")

    def _backend_kwargs(self) -> dict:
        kw = {"use_tensor_cores": True}
        if self.use_trtllm_gen:
            kw["backend"] = "trtllm-gen"
        return kw

    def _create_wrappers(self, params: PlanParams) -> FlashInferWrappers:
        backend_kw = self._backend_kwargs()
        if self.is_cuda_graph:
            decode = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace_buffer,
                self.kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.paged_kv_indptr_decode,
                paged_kv_indices_buffer=self._paged_kv_indices,
                paged_kv_last_page_len_buffer=self._paged_kv_last_page_len,
                **backend_kw,
            )
        else:
            decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, self.kv_layout, **backend_kw)
        prefill = BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, self.kv_layout)
        return FlashInferWrappers(decode, prefill)

    def prepare(self) -> None:
        super().prepare()
        nc, ng = self.num_contexts, self.num_generations
        self.num_cached_ctx_tokens, self.num_cached_gen_tokens = self.cached_token_split
        block_ids = self.kv_cache_manager_live.get_batch_cache_indices(self.request_ids)
        counts = torch.tensor([len(ids) for ids in block_ids], dtype=torch.int32)
        pages = torch.tensor([p for ids in block_ids for p in ids], dtype=torch.int32)
        self.paged_kv_indptr_prefill_host[1 : nc + 1] = torch.cumsum(counts[:nc], 0)
        self.paged_kv_indptr_decode_host[1 : ng + 1] = torch.cumsum(counts[nc:], 0)
        self._paged_kv_last_page_len_host[: nc + ng] = (self.kv_lens_host[: nc + ng] - 1) % self.page_size + 1
        self.qo_indptr_host[1 : nc + 1] = torch.cumsum(self.seq_lens[:nc], 0)

        num_pages = pages.numel()
        if num_pages > self._paged_kv_indices.numel():
            self._paged_kv_indices = torch.empty(2 * num_pages, dtype=torch.int32, device="cuda")  # expect: FC107
        self._paged_kv_indices[:num_pages].copy_(pages, non_blocking=True)  # ok: FC104
        self.paged_kv_indptr_decode[: ng + 1].copy_(self.paged_kv_indptr_decode_host[: ng + 1], non_blocking=True)  # ok: FC104
        self.qo_indptr_cuda[: nc + 1].copy_(self.qo_indptr_host[: nc + 1], non_blocking=True)

        self._planned.clear()
        for params in list(self._wrappers):
            self._plan_with_params(params)
            self._planned.add(params)
        if self.is_cross:
            self.plan_cross(self.encoder_lens)
        if self.is_cuda_graph:
            # padded rows of a generation-only graph read one token of page 0
            self._paged_kv_last_page_len[ng:].fill_(1)  # expect: FC104

    def needs_plan(self, params: PlanParams) -> bool:
        if params not in self._planned:
            return True
        # a graph-mode wrapper is planned for one batch size only
        return self.is_cuda_graph and self._wrappers[params].decode._fixed_batch_size != self.num_generations  # expect: FC103

    def plan(self, params: PlanParams) -> FlashInferWrappers:
        if self.needs_plan(params):
            self._plan_with_params(params)
            self._planned.add(params)
        return self._wrappers[params]

    def _plan_with_params(self, params: PlanParams) -> FlashInferWrappers:
        w = self._wrappers.get(params) or self._create_wrappers(params)
        self._wrappers[params] = w
        nc, ng = self.num_contexts, self.num_generations
        if ng > 0:
            decode_args = dict(
                indptr=self.paged_kv_indptr_decode_host[: ng + 1],
                indices=self._paged_kv_indices,
                last_page_len=self._paged_kv_last_page_len_host[nc : nc + ng],
            )
            w.decode.plan(  # ok: FC102
                **decode_args,
                num_qo_heads=params.num_heads,
                num_kv_heads=params.num_kv_heads,
                head_dim=params.head_dim,
                page_size=self.page_size,
                window_left=params.window_left,
                q_data_type=params.q_dtype,
                kv_data_type=params.kv_dtype,
            )
        if nc > 0:
            w.prefill.plan(  # expect: FC102
                self.qo_indptr_cuda[: nc + 1],
                self.paged_kv_indptr_prefill_host[: nc + 1],
                self._paged_kv_indices,
                self._paged_kv_last_page_len_host[:nc],
                params.num_heads,
                params.num_kv_heads,
                params.head_dim,
                self.page_size,
                causal=True,
                window_left=params.window_left,
                sm_scale=params.sm_scale,
                q_data_type=params.q_dtype,
                kv_data_type=params.kv_dtype,
            )
        self._plan_info[params] = (nc, ng)
        return w

    def plan_cross(self, encoder_lens: torch.Tensor) -> None:
        n = self.num_seqs
        self.cross_qo_indptr_host[1 : n + 1] = torch.cumsum(self.seq_lens, 0)
        self.enc_kv_indptr_host[1 : n + 1] = torch.cumsum(encoder_lens, 0)
        self.enc_kv_indptr_cuda[: n + 1].copy_(self.enc_kv_indptr_host[: n + 1], non_blocking=True)
        args = (self.cross_qo_indptr_host[: n + 1], self.enc_kv_indptr_cuda[: n + 1])
        p = self.cross_params
        self.cross_wrapper.plan(*args, p.num_heads, p.num_kv_heads, p.head_dim, causal=False, q_data_type=p.q_dtype)  # expect: FC102


class FlashInferAttention:
    """One attention layer's op, called like a module: ``attn(q, kv_cache, metadata)``."""

    def __init__(
        self, layer_idx: int, num_heads: int, num_kv_heads: int, head_dim: int, window_left: int = -1, is_cross: bool = False
    ):
        self.layer_idx = layer_idx
        self.is_cross = is_cross
        self.params = PlanParams(num_heads, num_kv_heads, head_dim, torch.bfloat16, torch.bfloat16, window_left)

    def __call__(
        self, q: torch.Tensor, kv_cache: Optional[torch.Tensor], metadata: FlashInferAttentionMetadata, **kwargs
    ) -> torch.Tensor:
        return self.forward(q, kv_cache, metadata, **kwargs)

    def forward(self, q, kv_cache, metadata: FlashInferAttentionMetadata, enc_kv=None) -> torch.Tensor:
        if self.is_cross:
            return self._cross_attention(q, enc_kv, metadata)
        w = metadata.plan(self.params)
        nt = metadata.num_ctx_tokens
        out = torch.empty_like(q)
        if metadata.num_contexts > 0:
            out[:nt] = w.prefill.run(q[:nt], kv_cache)
        if metadata.num_generations > 0:
            w.decode.run(q[nt:], kv_cache, out=out[nt:])  # ok: FC108
        return out

    def _cross_attention(self, q, enc_kv, metadata: FlashInferAttentionMetadata) -> torch.Tensor:
        k, v = enc_kv
        return metadata.cross_wrapper.run(q, k, v)  # expect: FC108
