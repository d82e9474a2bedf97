"""Positional step records.

``make_meta`` turns the scheduler's rows (one tuple per request) into the 9-slot
step record described in ``slots``. Everything else here re-packs records:
``host_view`` flattens the pairs to their pinned host side for the planner,
``replace_slot`` swaps one slot, ``pad_host_pairs`` pads the host sides to a
captured batch size.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .slots import (
    BATCH_SIZE,
    HOST,
    KV_INDICES,
    KV_INDPTR,
    KV_LAST_PAGE_LEN,
    META_LEN,
    POSITIONS,
    QO_INDPTR,
    SEQ_LENS,
)

Pair = tuple[torch.Tensor, torch.Tensor]


def _pinned(arr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(arr)).pin_memory()


def _pair(host: torch.Tensor, device: torch.device) -> Pair:
    """(device, host): the device copy is queued behind the step's other uploads."""
    return host.to(device, non_blocking=True), host


def make_meta(rows: Sequence[tuple], page_size: int, device: torch.device, mode: str = "decode") -> tuple:
    """Build the step record from the scheduler's rows.

    A row is ``(rid, seq_len, extend_len, page_ids, tokens)``; ``seq_len`` counts the
    tokens written by this step.
    """
    assert rows, "make_meta() needs at least one scheduled request"  # expect: FC109
    _rids, seq_lens, extend_lens, page_lists, _tokens = zip(*rows)
    bs = len(rows)

    seq_np = np.asarray(seq_lens, dtype=np.int32)
    extend_np = np.asarray(extend_lens, dtype=np.int32)
    pages_per_req = np.fromiter((len(p) for p in page_lists), dtype=np.int32, count=bs)

    qo_indptr = np.zeros(bs + 1, dtype=np.int32)
    np.cumsum(extend_np, out=qo_indptr[1:])
    kv_indptr = np.zeros(bs + 1, dtype=np.int32)
    np.cumsum(pages_per_req, out=kv_indptr[1:])
    last_page = ((seq_np - 1) % page_size + 1).astype(np.int32)
    positions = np.concatenate([np.arange(s - e, s, dtype=np.int64) for s, e in zip(seq_np, extend_np)])
    flat_pages = np.concatenate([np.asarray(p, dtype=np.int32) for p in page_lists])
    num_tokens = int(extend_np.sum())  # ok: FC101

    return (
        _pair(_pinned(qo_indptr), device),
        _pair(_pinned(kv_indptr), device),
        _pinned(flat_pages).to(device, non_blocking=True),
        _pair(_pinned(last_page), device),
        _pair(_pinned(seq_np), device),
        _pinned(positions).to(device, non_blocking=True),
        bs,
        num_tokens,
        mode,
    )


def host_view(meta: tuple) -> tuple:
    """The record with every pair replaced by its pinned host side (what ``plan()`` takes)."""
    return (
        meta[QO_INDPTR][HOST],
        meta[KV_INDPTR][HOST],
        meta[KV_INDICES],
        meta[KV_LAST_PAGE_LEN][HOST],
        meta[SEQ_LENS][HOST],
    ) + meta[POSITIONS:]


def replace_slot(meta: tuple, slot: int, value) -> tuple:
    """A copy of ``meta`` with ``slot`` set to ``value``."""
    assert 0 <= slot < META_LEN, f"no slot {slot} in a step record"  # expect: FC109
    return meta[:slot] + (value,) + meta[slot + 1 :]


def pad_host_pairs(meta: tuple, padded_bs: int) -> tuple:
    """Pad the host sides of the page pairs to ``padded_bs`` rows of empty requests.

    The device sides keep the real rows: the replay preparation copies them into
    the bucket's buffers, the planner reads the padded host sides.
    """
    bs = meta[BATCH_SIZE]
    if padded_bs == bs:
        return meta
    kv_d, kv_h = meta[KV_INDPTR]
    kv_h_pad = torch.empty(padded_bs + 1, dtype=kv_h.dtype, pin_memory=True)
    kv_h_pad[: bs + 1] = kv_h
    kv_h_pad[bs + 1 :] = kv_d[bs].item()  # expect: FC101
    last_d, last_h = meta[KV_LAST_PAGE_LEN]
    last_h_pad = torch.zeros(padded_bs, dtype=last_h.dtype, pin_memory=True)
    last_h_pad[:bs] = last_h
    meta = replace_slot(meta, KV_INDPTR, (kv_d, kv_h_pad))
    return meta[:3] + ((last_d, last_h_pad),) + meta[4:]


def transpose(rows: Sequence[tuple]) -> tuple[tuple, ...]:
    """Columns of a list of equal-length row tuples."""
    return tuple(zip(*rows))
