"""From the scheduler's decision to a forward-batch record.

The scheduler hands over a plain namespace (``req_ids``, ``req_pool_indices``, ``seq_lens``,
``extend_lens``, ``input_ids``, ``mode``); this module computes the paged-KV layout on the host with
numpy, keeps pinned host mirrors (``*_cpu``) and uploads device copies with ``non_blocking=True``.
The result is one ``SimpleNamespace`` with both.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from nsserve.records import make_record


def _pinned(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).pin_memory()


def host_layout(kv_lens: np.ndarray, extend_lens: np.ndarray, page_size: int) -> dict[str, np.ndarray]:
    """Paged-KV layout of the pages a batch attends through the paged kernels, computed on the host.

    Decode attends every cached token (its own included: the KV is stored before attention);
    extend attends its cached prefix through the paged kernel and its new tokens through the
    ragged one, so ``kv_lens`` is the prefix length there.
    """
    n = len(kv_lens)
    pages = (kv_lens + page_size - 1) // page_size
    kv_indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(pages, out=kv_indptr[1:])
    qo_indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(extend_lens, out=qo_indptr[1:])
    last_page_len = np.where(kv_lens > 0, (kv_lens - 1) % page_size + 1, 0).astype(np.int32)
    return {
        "pages": pages.astype(np.int32),
        "kv_indptr": kv_indptr,
        "qo_indptr": qo_indptr,
        "kv_last_page_len": last_page_len,
    }


def gather_kv_indices(req_to_page: torch.Tensor, req_idx: torch.Tensor, pages: torch.Tensor, nnz: int) -> torch.Tensor:
    """Flatten each request's page ids into one index array, on the device, without a host sync."""
    rows = torch.repeat_interleave(req_idx, pages, output_size=nnz)  # ok: FC101
    starts = torch.cumsum(pages, 0) - pages
    cols = torch.arange(nnz, device=req_idx.device) - torch.repeat_interleave(starts, pages, output_size=nnz)
    return req_to_page[rows, cols].to(torch.int32)


def build_forward_batch(sched: Any, pools: SimpleNamespace, device: torch.device, page_size: int) -> SimpleNamespace:
    seq_lens_np = np.asarray(sched.seq_lens, dtype=np.int32)
    extend_lens_np = np.asarray(sched.extend_lens, dtype=np.int32)
    kv_lens_np = seq_lens_np if sched.mode == "decode" else seq_lens_np - extend_lens_np
    layout = host_layout(kv_lens_np, extend_lens_np, page_size)
    n = len(seq_lens_np)
    nnz = int(layout["kv_indptr"][-1])

    host = {
        "seq_lens_cpu": _pinned(seq_lens_np),
        "extend_lens_cpu": _pinned(extend_lens_np),
        "kv_indptr_cpu": _pinned(layout["kv_indptr"]),
        "qo_indptr_cpu": _pinned(layout["qo_indptr"]),
        "kv_last_page_len_cpu": _pinned(layout["kv_last_page_len"]),
    }
    dev = {
        "seq_lens": host["seq_lens_cpu"].to(device, non_blocking=True),
        "kv_indptr": host["kv_indptr_cpu"].to(device, non_blocking=True),
        "qo_indptr": host["qo_indptr_cpu"].to(device, non_blocking=True),
        "kv_last_page_len": host["kv_last_page_len_cpu"].to(device, non_blocking=True),
    }
    req_pool_indices = torch.as_tensor(np.asarray(sched.req_pool_indices, dtype=np.int64)).to(device, non_blocking=True)
    pages = _pinned(layout["pages"]).to(device, non_blocking=True)
    kv_indices = gather_kv_indices(pools.req_to_page, req_pool_indices, pages, nnz)

    positions_np = np.concatenate(
        [np.arange(s - e, s, dtype=np.int64) for s, e in zip(seq_lens_np, extend_lens_np)]
    ) if n else np.zeros(0, dtype=np.int64)
    input_ids = torch.as_tensor(np.asarray(sched.input_ids, dtype=np.int64)).pin_memory().to(device, non_blocking=True)
    positions = torch.from_numpy(positions_np).pin_memory().to(device, non_blocking=True)
    out_cache_loc = pools.alloc_token_slots(int(extend_lens_np.sum()))

    return make_record(
        mode=sched.mode,
        is_decode=sched.mode == "decode",
        batch_size=n,
        num_tokens=int(extend_lens_np.sum()),
        req_ids=list(sched.req_ids),
        req_ids_np=np.asarray(sched.req_ids, dtype=np.int64),
        req_pool_indices=req_pool_indices,
        input_ids=input_ids,
        positions=positions,
        out_cache_loc=out_cache_loc,
        kv_indices=kv_indices,
        kv_nnz=nnz,
        **host,
        **dev,
    )
