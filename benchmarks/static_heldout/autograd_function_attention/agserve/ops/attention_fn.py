"""Attention and metadata steps as torch.autograd.Functions.

The engine is inference-only, but keeping each step a Function lets the model be traced and
checkpointed like a training model: every forward marks its outputs non-differentiable and
every backward refuses to run.
"""

from typing import Dict, Tuple

import torch
from torch.autograd.function import once_differentiable

from ..config import EngineConfig
from .registry import get_wrapper

# last plan signature per wrapper, to skip re-planning an unchanged batch
_LAST_PLAN: Dict[int, Tuple[int, ...]] = {}


class BuildPageIndices(torch.autograd.Function):
    """Fills the paged-KV indptr and indices buffers in place from the request page table."""

    @staticmethod
    def forward(ctx, seq_lens, req_pool_indices, req_to_page, kv_indptr, kv_indices, page_size: int):
        bs = seq_lens.shape[0]
        pages = (seq_lens + page_size - 1) // page_size
        torch.cumsum(pages, 0, dtype=torch.int32, out=kv_indptr[1 : bs + 1])  # ok: FC104
        # one CTA per request copies its row of req_to_page into kv_indices
        torch.ops.agserve_C.gather_page_table(req_to_page, req_pool_indices, kv_indptr, kv_indices)
        ctx.mark_dirty(kv_indptr, kv_indices)
        ctx.mark_non_differentiable(kv_indptr, kv_indices)
        return kv_indptr, kv_indices

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_indptr, grad_indices):
        return None, None, None, None, None, None


class PlanDecodeFn(torch.autograd.Function):
    """Plans the eager paged decode wrapper from the host mirrors, skipping an unchanged batch."""

    @staticmethod
    def forward(ctx, wrapper, kv_indptr_host, kv_indices, last_page_len_host, cfg: EngineConfig):
        sig = tuple(kv_indptr_host.tolist())  # ok: FC101
        if _LAST_PLAN.get(id(wrapper)) == sig and getattr(wrapper, "_plan_info", None) is not None:  # expect: FC103
            ctx.mark_non_differentiable(kv_indices)
            return kv_indices
        wrapper.plan(  # ok: FC102
            kv_indptr_host, kv_indices, last_page_len_host,
            cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
            pos_encoding_mode="NONE", q_data_type=torch.bfloat16, data_type=torch.bfloat16,
        )
        _LAST_PLAN[id(wrapper)] = sig
        ctx.mark_non_differentiable(kv_indices)
        return kv_indices

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("PlanDecodeFn has no backward")


class PlanMLAFn(torch.autograd.Function):
    """Plans the latent-attention wrapper registered as "mla"."""

    @staticmethod
    def forward(ctx, qo_indptr_host, kv_indptr_host, kv_indices, kv_len_arr, cfg: EngineConfig, causal: bool):
        wrapper = get_wrapper("mla")
        sm_scale = (cfg.head_dim + cfg.qk_rope_head_dim) ** -0.5
        wrapper.plan(  # expect: FC102
            qo_indptr_host, kv_indptr_host, kv_indices, kv_len_arr,
            cfg.num_qo_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.page_size,
            causal, sm_scale, torch.bfloat16, torch.bfloat16,
        )
        ctx.mark_non_differentiable(kv_indices)
        return kv_indices

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("PlanMLAFn has no backward")


class PagedDecodeAttention(torch.autograd.Function):
    """One decode token per request over the paged KV cache."""

    @staticmethod
    def forward(ctx, q, k_cache, v_cache, wrapper, seq_lens):
        if (seq_lens == 0).any():  # expect: FC101
            raise ValueError("paged decode over a request with no tokens")
        out = wrapper.run(q, (k_cache, v_cache))  # ok: FC108
        ctx.mark_non_differentiable(out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        raise RuntimeError("agserve attention is inference-only")


class RaggedPrefillAttention(torch.autograd.Function):
    """Causal attention over the new tokens of each request (no cached prefix).

    Written in the split style: forward takes no ctx, setup_context saves what backward would need.
    """

    @staticmethod
    def forward(q, k, v, wrapper):
        return wrapper.run(q, k, v)  # ok: FC108

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, _wrapper = inputs
        ctx.save_for_backward(q, k, v)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_out):
        raise RuntimeError("agserve attention is inference-only")

