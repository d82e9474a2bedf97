"""Zigzag split of causal sequences over context-parallel ranks.

A prompt padded to a multiple of ``2 * cp`` is cut into ``2 * cp`` chunks; rank
``r`` keeps chunks ``r`` and ``2 * cp - 1 - r`` so every rank does the same
causal work.  At ring step ``i`` rank ``r`` holds the KV of rank
``s = (r - i) % cp``: step 0 is causal over its own two chunks; for ``s < r``
both local chunks attend to ``s``'s first chunk; for ``s > r`` only the second
local chunk attends, to both of ``s``'s chunks.
"""
from __future__ import annotations

import dataclasses
from typing import List, Tuple

import numpy as np


def zigzag_bounds(seq_len: int, cp_size: int, rank: int) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    assert seq_len % (2 * cp_size) == 0, "pad the prompt to a multiple of 2 * cp_size"  # expect: FC109
    c = seq_len // (2 * cp_size)
    return (rank * c, (rank + 1) * c), ((2 * cp_size - 1 - rank) * c, (2 * cp_size - rank) * c)


def padded_len(seq_len: int, cp_size: int) -> int:
    m = 2 * cp_size
    return -(-seq_len // m) * m


@dataclasses.dataclass
class RingStepShape:
    step: int
    src_rank: int
    causal: bool
    hi_only: bool  # only the second local chunk attends (src_rank > rank)
    qo_indptr: np.ndarray
    kv_indptr: np.ndarray


def ring_step_shapes(seq_lens: List[int], cp_size: int, rank: int) -> List[RingStepShape]:
    """Host-side ragged layout of every ring step of one extend batch."""
    chunks = np.asarray([padded_len(n, cp_size) // (2 * cp_size) for n in seq_lens], dtype=np.int64)
    shapes = []
    for step in range(cp_size):
        src = (rank - step) % cp_size
        if step == 0:
            q, kv, causal, hi = 2 * chunks, 2 * chunks, True, False
        elif src < rank:
            q, kv, causal, hi = 2 * chunks, chunks, False, False
        else:
            q, kv, causal, hi = chunks, 2 * chunks, False, True
        qo_indptr = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
        kv_indptr = np.concatenate([[0], np.cumsum(kv)]).astype(np.int32)
        shapes.append(RingStepShape(step, src, causal, hi, qo_indptr, kv_indptr))
    return shapes


def chunk_rows(seq_lens: List[int], cp_size: int, second: bool) -> List[int]:
    """Rows of the first (or second) local chunk of every request, in the rank's [lo, hi] layout.
    Every rank has the same chunk sizes, so these are also the rows of a peer's KV block."""
    rows, base = [], 0
    for n in seq_lens:
        c = padded_len(n, cp_size) // (2 * cp_size)
        start = base + c if second else base
        rows.extend(range(start, start + c))
        base += 2 * c
    return np.asarray(rows, dtype=np.int64).tolist()  # ok: FC101
