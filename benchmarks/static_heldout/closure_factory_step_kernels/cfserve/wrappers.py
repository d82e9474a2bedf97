"""FlashInfer wrapper factories: cached eager wrappers and a per-bucket cache of graph-mode wrappers."""

from __future__ import annotations

import functools
from typing import Callable

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from .config import EngineConfig
from .workspaces import shared_float_workspace, window_workspace


@functools.lru_cache(maxsize=None)
def eager_decode_wrapper(device_index: int, kv_layout: str, nbytes: int) -> BatchDecodeWithPagedKVCacheWrapper:
    ws = shared_float_workspace(device_index, nbytes)
    return BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout, use_tensor_cores=True)


@functools.lru_cache(maxsize=None)
def window_decode_wrapper(device_index: int, kv_layout: str) -> BatchDecodeWithPagedKVCacheWrapper:
    # one eager wrapper for every sliding-window layer, in eager decode and in the captured buckets alike
    return BatchDecodeWithPagedKVCacheWrapper(window_workspace(device_index), kv_layout, use_tensor_cores=True)


def make_graph_wrapper_cache(
    workspace: torch.Tensor, bufs, kv_layout: str, backend: str = "fa2"
) -> Callable[[int], BatchDecodeWithPagedKVCacheWrapper]:
    """Returns ``graph_wrapper(bs)``: one graph-mode decode wrapper per bucket, bound to views of ``bufs``."""
    assert kv_layout in ("NHD", "HND"), f"unknown kv layout {kv_layout}"  # expect: FC109

    @functools.lru_cache(maxsize=None)
    def graph_wrapper(bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        return BatchDecodeWithPagedKVCacheWrapper(
            workspace,
            kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=bufs.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=bufs.kv_indices,
            paged_kv_last_page_len_buffer=bufs.last_page_len[:bs],
            backend=backend,
        )

    return graph_wrapper


def make_prefill_wrappers(
    cfg: EngineConfig,
    device: torch.device,
    ragged_workspace=lambda dev: torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev),  # expect: FC106
) -> tuple[BatchPrefillWithRaggedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper]:
    """Ragged wrapper for prompts without a cached prefix, paged wrapper for the others."""
    ragged = BatchPrefillWithRaggedKVCacheWrapper(ragged_workspace(device), cfg.kv_layout)
    paged_ws = torch.zeros(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
    paged = BatchPrefillWithPagedKVCacheWrapper(paged_ws, cfg.kv_layout)
    return ragged, paged
