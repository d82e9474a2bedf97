"""Cached resource factories.

Everything that is expensive to build and identical for a given key (device, bucket
size, byte count) is built once behind a functools cache: FlashInfer workspaces, per-bucket
page-table buffers, pinned staging mirrors and the process-wide eager decode wrapper.

`release_cached_resources()` drops the caches that rebuild lazily (OOM retry);
`rebuild_all()` drops every cache (weights reloaded, graphs recorded again).
"""
from __future__ import annotations

import functools
from typing import Iterable, NamedTuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from . import envs

# FlashInfer's two workspace tensors, summed by the memory report.
_WS_ATTRS = ("_float_workspace_buffer", "_int_workspace_buffer")


class DeviceBucket(NamedTuple):
    """Device page-table scratch of one batch-size bucket."""

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor


class HostBucket(NamedTuple):
    """Pinned host mirror of a bucket's page table; filled with numpy before plan()."""

    kv_indptr: torch.Tensor
    last_page_len: torch.Tensor


# --------------------------------------------------------------------------------------
# workspaces
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def decode_workspace(device: torch.device) -> torch.Tensor:
    """Float workspace shared by the eager decode wrappers of one device."""
    return torch.zeros(envs.DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


@functools.lru_cache(maxsize=None)
def graph_workspace(device: torch.device) -> torch.Tensor:
    """Workspace of the graph-mode decode wrappers, sized by envs.tune_graph_workspace()."""
    return torch.zeros(envs.GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # ok: FC106


@functools.cache
def workspace_for_limits(device: torch.device, max_num_tokens: int, num_qo_heads: int, head_dim: int) -> torch.Tensor:
    """Paged-prefill workspace sized from the token budget of one step."""
    nbytes = max_num_tokens * num_qo_heads * (head_dim * 4 + 8) + (16 << 20)
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # ok: FC106


def fa2_scratch(nbytes: int, device: torch.device) -> torch.Tensor:
    """Workspace for FA2-backend wrappers: the planner writes everything the kernels read."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


@functools.cache
def trtllm_decode_workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    """Scratch of trtllm-gen decode wrappers (split-k partials and their semaphores)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


@functools.cache
def trtllm_context_workspace(device: torch.device, nbytes: int, zero: bool = True) -> torch.Tensor:
    """Scratch of trtllm-gen's context kernel."""
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zero:
        buf.zero_()
    return buf


# --------------------------------------------------------------------------------------
# per-bucket page tables
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def bucket_buffers(bs: int, max_pages: int, device: torch.device) -> DeviceBucket:
    """Device page-table scratch for one bucket (eager draft-extend plans)."""
    assert bs > 0 and max_pages >= bs, f"bad bucket bs={bs} max_pages={max_pages}"  # expect: FC109
    return DeviceBucket(
        kv_indptr=torch.zeros(bs + 1, dtype=torch.int32, device=device),
        kv_indices=torch.zeros(max_pages, dtype=torch.int32, device=device),
        last_page_len=torch.ones(bs, dtype=torch.int32, device=device),
    )


@functools.lru_cache(maxsize=None)
def pinned_bucket(bs: int, max_pages: int, owner: str = "target") -> HostBucket:
    """Pinned host page table of one bucket; `owner` keeps target and draft apart."""
    return HostBucket(
        kv_indptr=torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True),
        last_page_len=torch.ones(bs, dtype=torch.int32, pin_memory=True),
    )


# --------------------------------------------------------------------------------------
# wrappers
# --------------------------------------------------------------------------------------


@functools.cache
def eager_decode_wrapper(device: torch.device, kv_layout: str = "NHD") -> BatchDecodeWithPagedKVCacheWrapper:
    """The process-wide eager decode wrapper of a device, planned once per step."""
    return BatchDecodeWithPagedKVCacheWrapper(decode_workspace(device), kv_layout, use_tensor_cores=True)


@functools.lru_cache(maxsize=None)
def window_decode_wrapper(device: torch.device, window: int, nbytes: int) -> BatchDecodeWithPagedKVCacheWrapper:
    """Eager decode wrapper of the sliding-window layers, one per (device, window)."""
    workspace = torch.zeros(nbytes, dtype=torch.uint8, device=device)  # ok: FC106
    return BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")


# --------------------------------------------------------------------------------------
# bookkeeping
# --------------------------------------------------------------------------------------

_LAZY_FACTORIES = (bucket_buffers, pinned_bucket, workspace_for_limits)
_ALL_FACTORIES = _LAZY_FACTORIES + (
    decode_workspace,
    graph_workspace,
    trtllm_decode_workspace,
    trtllm_context_workspace,
    eager_decode_wrapper,
    window_decode_wrapper,
)


def release_cached_resources() -> None:
    """Forget the caches that rebuild lazily; their holders keep what they already have."""
    for factory in _LAZY_FACTORIES:
        factory.cache_clear()


def rebuild_all() -> None:
    """Forget every cached resource (weights reloaded, graphs recorded again)."""
    for factory in _ALL_FACTORIES:
        factory.cache_clear()


def cache_stats() -> dict[str, dict[str, int]]:
    return {f.__name__: f.cache_info()._asdict() for f in _ALL_FACTORIES}


def wrapper_memory_bytes(wrappers: Iterable[BatchDecodeWithPagedKVCacheWrapper]) -> int:
    """Bytes held by the wrappers' workspaces, each distinct buffer counted once."""
    seen: set[int] = set()
    total = 0
    for w in wrappers:
        for name in _WS_ATTRS:
            buf = getattr(w, name, None)  # expect: FC103
            if buf is None or buf.data_ptr() in seen:
                continue
            seen.add(buf.data_ptr())
            total += buf.numel() * buf.element_size()
    return total
