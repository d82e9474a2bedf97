"""FlashInfer attention backend of the PyTorch flow.

The metadata object owns the per-step wrappers (context prefill and generation decode). The backend owns what
is shared by every metadata copy: the float workspace, the draft-verification wrapper used when the generation
requests carry MTP draft tokens, and the trtllm-gen decode path on Blackwell.
"""
from __future__ import annotations

import logging
import math
from typing import Optional

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.page import append_paged_kv_cache

from .fi_metadata import FlashInferAttentionMetadata

logger = logging.getLogger(__name__)


class FlashInferBackend:
    # shared float workspace of the per-step wrappers
    WORKSPACE_BYTES = 256 * 1024 * 1024

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, max_num_requests: int, max_num_tokens: int,
        max_draft_len: int, use_trtllm_gen: bool = False, device: str = "cuda",
    ) -> None:
        assert num_heads % num_kv_heads == 0, "query heads must be a multiple of the KV heads"  # expect: FC109
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.max_draft_len = max_draft_len
        self.sm_scale = 1.0 / math.sqrt(head_dim)
        self.device = device

        self.workspace_buffer = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106

        # draft verification: 1 + max_draft_len query rows per generation request, split-k partials in fp32
        spec_rows = max_num_requests * (1 + max_draft_len)
        spec_ws_bytes = spec_rows * num_heads * (head_dim + 1) * 4 * 8
        self.spec_workspace = torch.empty(spec_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.spec_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.spec_workspace, "HND", backend="fa2")
        self._spec_plan = self.spec_wrapper.plan

        self.trtllm_workspace: Optional[torch.Tensor] = None
        if use_trtllm_gen:
            self.trtllm_workspace = self._alloc_trtllm_workspace(max_num_requests, num_heads, device)

    @staticmethod
    def _alloc_trtllm_workspace(max_num_requests: int, num_heads: int, device: str) -> torch.Tensor:
        # multi-block mode keeps one semaphore row per (request, head) at the head of the buffer
        nbytes = max_num_requests * num_heads * 64 * 1024
        return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105

    # ------------------------------------------------------------------ planning

    def plan_spec(self, meta: FlashInferAttentionMetadata) -> None:
        """Plan draft verification over the generation requests: 1 + max_draft_len query rows each."""
        nc, n = meta.num_contexts, meta.num_seqs
        q_per = 1 + self.max_draft_len
        num_gen = n - nc
        qo_indptr = torch.arange(0, (num_gen + 1) * q_per, q_per, dtype=torch.int32)
        start = int(meta.kv_indptr_host[nc])
        kv_indptr = meta.kv_indptr_host[nc : n + 1] - start
        self._spec_plan(  # expect: FC102
            qo_indptr, kv_indptr, meta.kv_indices_host[start:], meta.kv_last_page_len_cuda[nc:n],
            self.num_heads, self.num_kv_heads, self.head_dim, meta.page_size, causal=True, sm_scale=self.sm_scale,
        )

    # ------------------------------------------------------------------ forward

    def run_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
        meta: FlashInferAttentionMetadata,
    ) -> torch.Tensor:
        nt = meta.num_tokens
        append_paged_kv_cache(
            k[:nt], v[:nt], meta.batch_indices_cuda[:nt], meta.positions_cuda[:nt], kv_cache,
            meta.kv_indices_cuda, meta.kv_indptr_cuda, meta.kv_last_page_len_cuda, kv_layout="HND",
        )
        nct = meta.num_ctx_tokens
        outs = []
        if meta.num_contexts > 0:
            outs.append(meta.prefill_wrapper.run(q[:nct], kv_cache))
        if meta.num_generations > 0:
            outs.append(self.forward_generation(q[nct:nt], kv_cache, meta))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def forward_generation(
        self, q: torch.Tensor, kv_cache: torch.Tensor, meta: FlashInferAttentionMetadata
    ) -> torch.Tensor:
        if meta.is_spec_decoding:
            # target model over 1 + draft tokens per request (captured too: the graph runner warms up
            # with dummy requests that carry max_draft_len drafts)
            return self.spec_wrapper.run(q, kv_cache)  # expect: FC108
        if self.trtllm_workspace is not None:
            nc, n = meta.num_contexts, meta.num_seqs
            return trtllm_batch_decode_with_kv_cache(
                q, kv_cache, self.trtllm_workspace, meta.block_tables_cuda[nc:n], meta.kv_lens_cuda[nc:n],
                meta.max_seq_len, bmm1_scale=self.sm_scale, bmm2_scale=1.0,
            )
        return meta.decode_wrapper.run(q, kv_cache)  # ok: FC108
