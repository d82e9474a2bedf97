"""Plan keyword builders and KV index helpers shared by the eager and graph paths.

The builders return plain dicts with every keyword any supported release understands;
``compat.filter_plan_kwargs`` then drops what the installed ``plan()`` does not take.
"""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Optional

import torch

from compatserve.config import EngineConfig

# fixed_split_size is chosen from the longest KV in the batch: splits of at least this many
# pages, at most MAX_SPLITS of them.
MIN_SPLIT_PAGES = 16
MAX_SPLITS = 32


def decode_plan_kwargs(
    cfg: EngineConfig,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last_page_len: torch.Tensor,
    *,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    non_blocking: bool = True,
) -> Dict[str, Any]:
    return dict(
        indptr=indptr,
        indices=indices,
        last_page_len=last_page_len,
        num_qo_heads=cfg.num_qo_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        page_size=cfg.page_size,
        pos_encoding_mode="NONE",
        window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        q_data_type=cfg.dtype,
        kv_data_type=cfg.dtype,
        # 0.1.6 calls it data_type
        data_type=cfg.dtype,
        non_blocking=non_blocking,
    )


def ragged_plan_kwargs(cfg: EngineConfig, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor) -> Dict[str, Any]:
    return dict(
        qo_indptr=qo_indptr,
        kv_indptr=kv_indptr,
        num_qo_heads=cfg.num_qo_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        # >= 0.2 splits head_dim into head_dim_qk / head_dim_vo
        head_dim_qk=cfg.head_dim,
        causal=True,
        q_data_type=cfg.dtype,
        kv_data_type=cfg.dtype,
    )


def split_size_for(max_kv_len: int, cfg: EngineConfig) -> int:
    pages = (max_kv_len + cfg.page_size - 1) // cfg.page_size
    return max(MIN_SPLIT_PAGES, -(-pages // MAX_SPLITS))


def add_split_kv_kwargs(
    kw: Dict[str, Any], params: FrozenSet[str], max_kv_len: int, cfg: EngineConfig
) -> Dict[str, Any]:
    """Pin the split-k layout where the release lets us (keeps graph and eager numerics equal)."""
    if "fixed_split_size" in params:  # ok: FC101
        kw["fixed_split_size"] = split_size_for(max_kv_len, cfg)
    if "disable_split_kv" in params:
        kw["disable_split_kv"] = False
    return kw


def gather_kv_indices(
    req_to_page: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_counts: torch.Tensor,
    page_starts: Optional[torch.Tensor],
    indptr: torch.Tensor,
    num_pages: int,
    out: torch.Tensor,
) -> None:
    """out[indptr[i]:indptr[i+1]] = req_to_page[req_pool_indices[i], start_i : start_i + count_i].

    ``num_pages`` is the host-side total, so no repeat_interleave has to ask the device for it.
    """
    rows = torch.repeat_interleave(req_pool_indices, page_counts, output_size=num_pages)  # ok: FC101
    firsts = torch.repeat_interleave(indptr[:-1].long(), page_counts, output_size=num_pages)
    cols = torch.arange(num_pages, device=out.device) - firsts
    if page_starts is not None:
        cols += torch.repeat_interleave(page_starts, page_counts, output_size=num_pages)
    out[:num_pages] = req_to_page[rows, cols]
