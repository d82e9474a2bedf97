"""Keyword-dict builders for FlashInfer plan() calls and wrapper constructors.

Every plan in the engine is ``wrapper.plan(**kw)`` with ``kw`` built here from the config
namespace plus the per-call tensors; extra keywords are forwarded untouched so call sites can add
``window_left=`` or ``causal=`` without a new builder.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

# Parameters of BatchDecodeWithPagedKVCacheWrapper.plan that this engine uses.
DECODE_PLAN_PARAMS = frozenset(
    {
        "indptr",
        "indices",
        "last_page_len",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim",
        "page_size",
        "pos_encoding_mode",
        "window_left",
        "logits_soft_cap",
        "q_data_type",
        "kv_data_type",
        "non_blocking",
    }
)


def static_decode_kwargs(cfg: SimpleNamespace, **extra: Any) -> dict[str, Any]:
    """The shape part of a decode plan: the same every step."""
    kw = dict(
        num_qo_heads=cfg.num_qo_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        page_size=cfg.page_size,
        pos_encoding_mode="NONE",
        q_data_type=cfg.torch_dtype,
        kv_data_type=cfg.torch_dtype,
    )
    kw.update(extra)
    return kw


def decode_plan_kwargs(
    cfg: SimpleNamespace,
    *,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last_page_len: torch.Tensor,
    **extra: Any,
) -> dict[str, Any]:
    kw = static_decode_kwargs(cfg, **extra)
    kw.update(indptr=indptr, indices=indices, last_page_len=last_page_len)
    return kw


def ragged_plan_kwargs(cfg: SimpleNamespace, *, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, **extra: Any) -> dict[str, Any]:
    kw = {
        "qo_indptr": qo_indptr,
        "kv_indptr": kv_indptr,
        "num_qo_heads": cfg.num_qo_heads,
        "num_kv_heads": cfg.num_kv_heads,
        "head_dim_qk": cfg.head_dim,
        "causal": True,
        "q_data_type": cfg.torch_dtype,
    }
    return {**kw, **extra}


def paged_prefill_common(cfg: SimpleNamespace, **extra: Any) -> dict[str, Any]:
    common = {
        "num_qo_heads": cfg.num_qo_heads,
        "num_kv_heads": cfg.num_kv_heads,
        "head_dim_qk": cfg.head_dim,
        "page_size": cfg.page_size,
        "causal": False,
        "q_data_type": cfg.torch_dtype,
        "kv_data_type": cfg.torch_dtype,
    }
    common.update(extra)
    return common


def graph_wrapper_kwargs(bufs: SimpleNamespace, bs: int, **extra: Any) -> dict[str, Any]:
    """Constructor keywords of a graph-mode decode wrapper bound to rows of ``bufs``."""
    assert "use_cuda_graph" not in extra, "graph_wrapper_kwargs always builds graph-mode wrappers"  # expect: FC109
    kw = dict(
        use_cuda_graph=True,
        paged_kv_indptr_buffer=bufs.kv_indptr[: bs + 1],
        paged_kv_indices_buffer=bufs.kv_indices,
        paged_kv_last_page_len_buffer=bufs.kv_last_page_len[:bs],
    )
    kw.update(extra)
    return kw


def only_decode_params(kw: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if k in DECODE_PLAN_PARAMS}
