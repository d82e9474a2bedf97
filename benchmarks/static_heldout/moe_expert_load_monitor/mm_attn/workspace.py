"""Workspace sizing and the allocation helpers of the attention side."""
from __future__ import annotations

import functools

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from moemon import MoEConfig


def graph_ws_bytes(cfg: MoEConfig) -> int:
    rows = max(cfg.decode_buckets)
    return rows * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 64 + (32 << 20)


def mtp_ws_bytes(cfg: MoEConfig) -> int:
    return max(cfg.decode_buckets) * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 16 + (8 << 20)


def zeroed_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    buf.zero_()
    return buf


@functools.lru_cache(maxsize=None)
def overflow_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


def build_mtp_wrapper(workspace: torch.Tensor, layout: str) -> BatchDecodeWithPagedKVCacheWrapper:
    """The MTP head attends its own KV with a single decode wrapper for every batch size."""
    return BatchDecodeWithPagedKVCacheWrapper(workspace, layout)
