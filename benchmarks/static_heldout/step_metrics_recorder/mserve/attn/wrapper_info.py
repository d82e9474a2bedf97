"""What the /debug/attention endpoint shows about the live wrappers."""

from __future__ import annotations

from typing import Any, Dict

from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from ..kv_pool import PagedKVPool


def describe_wrapper(w: BatchDecodeWithPagedKVCacheWrapper) -> Dict[str, Any]:
    return {
        "cuda_graph": w.is_cuda_graph_enabled,  # ok: FC103
        "backend": w._backend,  # expect: FC103
        "fixed_batch_size": vars(w).get("_fixed_batch_size"),  # expect: FC103
    }


def describe_pool(pool: PagedKVPool) -> Dict[str, Any]:
    return {
        "layout": pool._kv_layout,  # ok: FC103
        "free_pages": pool.free_pages(),
        "page_size": pool.page_size,
    }
