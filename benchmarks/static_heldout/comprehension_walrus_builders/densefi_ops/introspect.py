"""Introspection for the start-up checks and the admin endpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

if TYPE_CHECKING:
    from densefi.attention import FlashInferBackend

# The buffers a graph-mode decode wrapper keeps after construction.
_FI_BOUND_BUFFERS = ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf")
_PUBLIC_ENTRY_POINTS = ("plan", "run", "run_return_lse")


def bound_buffer_table(
    wrappers: Mapping[tuple[str, int], BatchDecodeWithPagedKVCacheWrapper],
) -> dict[tuple[tuple[str, int], str], torch.Tensor]:
    """(wrapper key, buffer name) -> the tensor the wrapper holds for it."""
    return {
        (key, name): getattr(w, name)  # expect: FC103
        for key, w in wrappers.items()
        for name in _FI_BOUND_BUFFERS
    }


def entry_points(wrapper: BatchDecodeWithPagedKVCacheWrapper) -> dict[str, bool]:
    return {name: callable(getattr(wrapper, name, None)) for name in _PUBLIC_ENTRY_POINTS}  # ok: FC103


def buffer_report(backend: "FlashInferBackend") -> dict[str, int]:
    """Admin endpoint: pages in use per full-attention group, read from the device page lists."""
    return {f"{g}/pages": int(buf[-1]) for g, buf in backend.kv_indptr_gpu.items()}  # ok: FC101


def wrapper_census(backend: "FlashInferBackend") -> dict[str, int]:
    kinds = {
        "decode": backend.decode_wrappers,
        "window": backend.window_wrappers,
        "prefill": backend.prefill_wrappers,
        "verify": backend.verify_wrappers,
        "cascade": backend.cascade_wrappers,
        "graph": backend.graph_wrappers,
    }
    return {kind: len(ws) for kind, ws in kinds.items() if ws}
