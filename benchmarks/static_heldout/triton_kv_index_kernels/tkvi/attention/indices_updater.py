"""Per-step FlashInfer planning (SGLang's ``FlashInferIndicesUpdaterDecode`` / ``...Prefill``).

The device-side metadata (kv_indptr, kv_indices) is written by Triton kernels into the backend's persistent
buffers -- for graph-mode wrappers, the very buffers the wrapper was built with -- and ``begin_forward`` is
meant to get the host mirrors that the same helpers build from the ``*_cpu`` lengths.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import triton

from tkv_kernels.autotune_table import create_kv_indices_blocked_kernel, max_len_bucket
from tkv_kernels.index_kernels import cumsum_indptr_, launch_build_kv_indptr, launch_create_kv_indices

if TYPE_CHECKING:
    from tkvi.attention.flashinfer_backend import FlashInferAttnBackend
    from tkvi.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class FlashInferIndicesUpdaterDecode:
    def __init__(self, model_runner: "ModelRunner", attn_backend: "FlashInferAttnBackend"):
        args = model_runner.server_args
        self.num_qo_heads = args.num_attention_heads
        self.num_kv_heads = args.num_kv_heads
        self.head_dim = args.head_dim
        self.q_dtype = model_runner.dtype
        self.kv_dtype = model_runner.kv_cache_dtype
        self.max_context_len = args.max_context_len
        self.device = model_runner.device
        # persistent device buffers (bound to the graph-mode wrappers) and their pinned host mirrors
        self.kv_indptr = attn_backend.kv_indptr
        self.kv_indptr_cpu = attn_backend.kv_indptr_cpu
        self.kv_indptr_swa = attn_backend.kv_indptr_swa
        self.kv_last_page_len = attn_backend.kv_last_page_len
        self.kv_last_page_len_cpu = attn_backend.kv_last_page_len_cpu
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        # (bs, kv tokens) of the last plan, for the engine's debug report
        self._plan_info = None  # ok: FC103

    def last_plan(self):
        return self._plan_info

    def update(self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, decode_wrapper):
        bs = len(req_pool_indices)
        return self.call_begin_forward(decode_wrapper, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, bs)

    def call_begin_forward(self, wrapper, req_pool_indices, paged_kernel_lens, paged_kernel_lens_cpu, paged_kernel_lens_sum, bs):
        if (paged_kernel_lens > self.max_context_len).any():  # expect: FC101
            raise ValueError(f"seq_lens {paged_kernel_lens} exceed max_context_len={self.max_context_len}")  # ok: FC101

        # device indptr for the index kernel, host mirror for plan(); same lengths, two buffers
        kv_indptr = launch_build_kv_indptr(paged_kernel_lens, self.kv_indptr, bs)  # ok: FC104
        kv_indptr_cpu = cumsum_indptr_(paged_kernel_lens_cpu, self.kv_indptr_cpu, bs)

        if wrapper.is_cuda_graph_enabled:  # ok: FC103
            # graph mode: fill the indices buffer the wrapper was built with, in place
            kv_indices = wrapper._paged_kv_indices_buf  # expect: FC103
        else:
            kv_indices = torch.empty(paged_kernel_lens_sum, dtype=torch.int32, device=self.device)
        launch_create_kv_indices(self.req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, None, kv_indices, bs)  # ok: FC104

        wrapper.begin_forward(  # ok: FC102
            kv_indptr_cpu,
            kv_indices,
            self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            data_type=self.kv_dtype,
            q_data_type=self.q_dtype,
            non_blocking=True,
        )
        self._plan_info = (bs, paged_kernel_lens_sum)
        return kv_indptr_cpu, kv_indices

    def update_sliding_window(self, req_pool_indices, seq_lens, window, wrapper):
        """Plan the sliding-window wrapper: each request attends to its last `window` tokens."""
        bs = len(req_pool_indices)
        window_lens = torch.clamp(seq_lens, max=window)
        window_start = seq_lens - window_lens
        kv_indptr = cumsum_indptr_(window_lens, self.kv_indptr_swa, bs)
        kv_indices = torch.empty(kv_indptr[bs].item(), dtype=torch.int32, device=self.device)  # expect: FC101
        launch_create_kv_indices(self.req_to_token, req_pool_indices, window_lens, kv_indptr, window_start, kv_indices, bs)
        wrapper.begin_forward(  # expect: FC102
            kv_indptr,
            kv_indices,
            self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            window_left=window - 1,
            data_type=self.kv_dtype,
            q_data_type=self.q_dtype,
        )


class FlashInferIndicesUpdaterPrefill:
    def __init__(self, model_runner: "ModelRunner", attn_backend: "FlashInferAttnBackend"):
        args = model_runner.server_args
        self.num_qo_heads = args.num_attention_heads
        self.num_kv_heads = args.num_kv_heads
        self.head_dim = args.head_dim
        self.q_dtype = model_runner.dtype
        self.max_context_len = args.max_context_len
        self.device = model_runner.device
        self.kv_indptr = attn_backend.kv_indptr
        self.kv_indptr_cpu = attn_backend.kv_indptr_cpu
        self.qo_indptr = attn_backend.qo_indptr
        self.qo_indptr_cpu = attn_backend.qo_indptr_cpu
        self.kv_last_page_len = attn_backend.kv_last_page_len
        self.kv_last_page_len_cpu = attn_backend.kv_last_page_len_cpu
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.prefill_wrapper_ragged = attn_backend.prefill_wrapper_ragged

    def update(
        self,
        req_pool_indices,
        seq_lens,
        seq_lens_cpu,
        prefix_lens,
        prefix_lens_cpu,
        extend_lens,
        extend_lens_cpu,
        kv_indices,
        prefill_wrapper_paged,
        use_ragged,
    ):
        bs = len(req_pool_indices)
        if use_ragged:
            # the ragged wrapper covers the new tokens, the paged wrapper only the cached prefix
            paged_kernel_lens, paged_kernel_lens_cpu = prefix_lens, prefix_lens_cpu
        else:
            paged_kernel_lens, paged_kernel_lens_cpu = seq_lens, seq_lens_cpu
        return self.call_begin_forward(
            self.prefill_wrapper_ragged,
            prefill_wrapper_paged,
            req_pool_indices,
            paged_kernel_lens,
            paged_kernel_lens_cpu,
            extend_lens,
            extend_lens_cpu,
            kv_indices,
            bs,
            use_ragged,
        )

    def call_begin_forward(
        self,
        wrapper_ragged,
        wrapper_paged,
        req_pool_indices,
        paged_kernel_lens,
        paged_kernel_lens_cpu,
        extend_lens,
        extend_lens_cpu,
        kv_indices,
        bs,
        use_ragged,
    ):
        num_kv = int(paged_kernel_lens_cpu.sum())  # ok: FC101
        if num_kv > kv_indices.numel():
            raise ValueError(f"kv_indices scratch holds {kv_indices.numel()} ids, the batch needs {num_kv}")
        bucket = max_len_bucket(int(paged_kernel_lens_cpu.max()) if bs else 0)

        kv_indptr = cumsum_indptr_(paged_kernel_lens, self.kv_indptr, bs)  # ok: FC104
        kv_indptr_cpu = cumsum_indptr_(paged_kernel_lens_cpu, self.kv_indptr_cpu, bs)

        # one program per (request, block); BLOCK_SIZE comes from the autotune table
        grid = lambda META: (bs, triton.cdiv(int(paged_kernel_lens.max()), META["BLOCK_SIZE"]))  # expect: FC101
        create_kv_indices_blocked_kernel[grid](
            self.req_to_token,
            req_pool_indices,
            paged_kernel_lens,
            kv_indptr,
            kv_indices,
            bucket,
            self.req_to_token.shape[1],
        )
        kv_indices = kv_indices[: kv_indptr[bs]]  # expect: FC101

        qo_indptr = cumsum_indptr_(extend_lens, self.qo_indptr, bs)
        qo_indptr_cpu = cumsum_indptr_(extend_lens_cpu, self.qo_indptr_cpu, bs)
        if use_ragged:
            wrapper_ragged.begin_forward(  # expect: FC102
                qo_indptr,
                qo_indptr,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                q_data_type=self.q_dtype,
                causal=True,
            )
        wrapper_paged.begin_forward(  # expect: FC102
            qo_indptr_cpu,
            kv_indptr_cpu,
            kv_indices,
            paged_kv_last_page_len=self.kv_last_page_len[:bs],
            num_qo_heads=self.num_qo_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim_qk=self.head_dim,
            page_size=1,
            q_data_type=self.q_dtype,
            causal=not use_ragged,
        )
        logger.debug("prefill plan: bs=%d kv=%d ragged=%s", bs, num_kv, use_ragged)
        return kv_indices
