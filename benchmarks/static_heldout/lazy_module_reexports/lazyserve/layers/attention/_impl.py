"""FlashInfer planning calls, written against the FlashInfer 0.2 wrapper API.

Backends import ``plan`` (the facade), never this module: when FlashInfer changes a
signature only this file and the facade's bindings change.
"""
from __future__ import annotations

from dataclasses import dataclass

import flashinfer
import torch

DecodeWrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper

# workspace tensors every wrapper allocates or receives; for the memory report
_WORKSPACE_ATTRS = ("_float_workspace_buffer", "_int_workspace_buffer")


@dataclass(frozen=True)
class PlanDims:
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    q_dtype: torch.dtype = torch.bfloat16
    kv_dtype: torch.dtype = torch.bfloat16


def plan_decode(wrapper, indptr, indices, last_page_len, dims: PlanDims, window_left: int = -1) -> None:
    wrapper.plan(  # ok: FC102
        indptr,
        indices,
        last_page_len,
        dims.num_qo_heads,
        dims.num_kv_heads,
        dims.head_dim,
        dims.page_size,
        pos_encoding_mode="NONE",
        window_left=window_left,
        q_data_type=dims.q_dtype,
        kv_data_type=dims.kv_dtype,
    )


def plan_prefill(wrapper, qo_indptr, kv_indptr, kv_indices, last_page_len, dims: PlanDims, causal: bool = True) -> None:
    wrapper.plan(  # expect: FC102
        qo_indptr,
        kv_indptr,
        kv_indices,
        last_page_len,
        dims.num_qo_heads,
        dims.num_kv_heads,
        dims.head_dim,
        dims.page_size,
        causal=causal,
        q_data_type=dims.q_dtype,
        kv_data_type=dims.kv_dtype,
    )


def window_needed(seq_lens: torch.Tensor, window: int) -> bool:
    """Whether any request is longer than the sliding window (otherwise no clipping is needed)."""
    return seq_lens.max().item() > window  # expect: FC101


def workspace_bytes_in_use(wrapper) -> int:
    total = 0
    for attr in _WORKSPACE_ATTRS:
        buf = getattr(wrapper, attr, None)  # expect: FC103
        if buf is not None:
            total += buf.numel() * buf.element_size()
    return total
