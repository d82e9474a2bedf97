"""Indices updaters: fill kv_indptr / kv_indices for the decode and prefill wrappers, then plan them.

The decode updater hands its plan arguments down as one ``*args`` tuple through three levels
(``update`` -> ``_call_plan`` -> ``plan_via_args``); the prefill updater builds one keyword bag and
lets ``plan_with`` drop the engine's own keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List

import torch
import triton
import triton.language as tl

from kwstack.plan_kwargs import plan_via_args, plan_with

if TYPE_CHECKING:
    from kwstack.flashinfer_backend import FlashInferAttnBackend
    from kwstack.forward_batch import ForwardBatch


@triton.jit
def create_flashinfer_kv_indices_triton(
    req_to_token_ptr,
    req_pool_indices_ptr,
    kv_indptr_ptr,
    kv_start_idx,
    kv_indices_ptr,
    req_to_token_stride: tl.constexpr,
):
    BLOCK: tl.constexpr = 512
    pid = tl.program_id(axis=0)
    req_idx = tl.load(req_pool_indices_ptr + pid)
    start = tl.load(kv_indptr_ptr + pid)
    end = tl.load(kv_indptr_ptr + pid + 1)
    length = end - start
    for i in range(0, tl.cdiv(length, BLOCK)):
        offs = i * BLOCK + tl.arange(0, BLOCK)
        mask = offs < length
        tok = tl.load(req_to_token_ptr + req_idx * req_to_token_stride + offs, mask=mask)
        tl.store(kv_indices_ptr + start + offs, tok, mask=mask)


class FlashInferIndicesUpdaterDecode:
    def __init__(self, backend: "FlashInferAttnBackend"):
        self.backend = backend
        self.kv_indptr = backend.kv_indptr
        self.kv_indptr_cpu = backend.kv_indptr_cpu
        self.kv_last_page_len = backend.kv_last_page_len
        self.req_to_token = backend.req_to_token
        self.plan_defaults = dict(
            num_qo_heads=backend.num_qo_heads,
            num_kv_heads=backend.num_kv_heads,
            head_dim=backend.head_dim,
            page_size=backend.page_size,
            q_data_type=backend.q_dtype,
            kv_data_type=backend.kv_dtype,
            trace_id=None,
        )

    # level 1: the backend's entry point
    def update(self, req_pool_indices, seq_lens, seq_lens_cpu, wrappers: List, *extra):
        bs = seq_lens_cpu.shape[0]
        plan_args = (self.kv_indptr[: bs + 1], self.backend.kv_indices, self.kv_last_page_len[:bs])
        for wrapper in wrappers:
            self._call_plan(wrapper, req_pool_indices, seq_lens, seq_lens_cpu, *plan_args, *extra)

    # level 2: unpack, fill the indices, hand the tuple on
    def _call_plan(self, wrapper, *args):
        req_pool_indices, seq_lens, seq_lens_cpu, *plan_args = args
        bs = seq_lens_cpu.shape[0]
        kv_indptr = plan_args[0]
        kv_indptr[1:] = torch.cumsum(seq_lens, dim=0)  # ok: FC104
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(seq_lens_cpu, dim=0)
        nnz = int(kv_indptr[-1])  # expect: FC101
        self.backend.ensure_capacity(kv_indices=nnz)
        create_flashinfer_kv_indices_triton[(bs,)](
            self.req_to_token,
            req_pool_indices,
            kv_indptr,
            None,
            self.backend.kv_indices,
            self.req_to_token.shape[1],
        )
        # level 3: positional plan with the model's keywords
        plan_via_args(wrapper, *plan_args, **self.plan_defaults)


class FlashInferIndicesUpdaterPrefill:
    def __init__(self, backend: "FlashInferAttnBackend"):
        self.backend = backend
        self.device = backend.device
        self.qo_indptr = backend.qo_indptr
        self.qo_indptr_cpu = backend.qo_indptr_cpu
        self.kv_indptr = backend.kv_indptr
        self.kv_indptr_cpu = backend.kv_indptr_cpu
        self.kv_last_page_len_cpu = backend.kv_last_page_len_cpu
        self.req_to_token = backend.req_to_token
        self.debug_checks = backend.debug_checks

    def update(self, fb: "ForwardBatch", prefill_wrapper, ragged_wrapper, use_ragged: bool):
        be = self.backend
        bs = fb.batch_size
        extend_lens_cpu = torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int32)
        self.qo_indptr_cpu[1 : bs + 1] = torch.cumsum(extend_lens_cpu, dim=0)
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(fb.seq_lens_cpu, dim=0)
        self.qo_indptr[: bs + 1].copy_(self.qo_indptr_cpu[: bs + 1], non_blocking=True)
        total_tokens = int(self.qo_indptr_cpu[bs])
        # token -> request row, and token -> first KV slot of its request, for the extend kernels
        req_rows = torch.arange(bs, dtype=torch.int32, device=self.device)
        be.token_to_req = torch.repeat_interleave(req_rows, fb.extend_seq_lens, output_size=total_tokens)  # ok: FC101
        be.token_kv_start = torch.repeat_interleave(self.kv_indptr[:bs], fb.extend_seq_lens)  # expect: FC101
        bag = dict(
            qo_indptr=self.qo_indptr_cpu[: bs + 1],
            paged_kv_indptr=self.kv_indptr_cpu[: bs + 1],
            paged_kv_indices=be.kv_indices,
            paged_kv_last_page_len=self.kv_last_page_len_cpu[:bs],
            num_qo_heads=be.num_qo_heads,
            num_kv_heads=be.num_kv_heads,
            head_dim_qk=be.head_dim,
            page_size=be.page_size,
            causal=True,
            q_data_type=be.q_dtype,
            check_nnz=self.debug_checks,
            trace_id=fb.call_kwargs.get("trace_id"),
        )
        plan_with(prefill_wrapper, **bag)
        if use_ragged:
            ragged_args = (
                self.qo_indptr_cpu[: bs + 1],
                self.qo_indptr_cpu[: bs + 1],
                be.num_qo_heads,
                be.num_kv_heads,
                be.head_dim,
            )
            ragged_wrapper.plan(*ragged_args, causal=True, q_data_type=be.q_dtype)  # ok: FC102
