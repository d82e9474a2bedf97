"""Host-side page lists per head group (numpy on the scheduler's mirrors)."""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np


def window_page_lists(
    seq_lens_np: np.ndarray,
    block_table_np: np.ndarray,
    slots_np: np.ndarray,
    window: int,
    page_size: int,
    extend_lens_np: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pages a group attends per row: every page for a global group (``window < 0``); for a
    local group the pages covering the last ``window`` tokens before the first query token of
    the row.  Returns ``(indptr, indices, last_page_len, first_page)``."""
    seq = seq_lens_np.astype(np.int64)
    n = seq.shape[0]
    last_page = (seq - 1) // page_size
    if window < 0:
        first_page = np.zeros(n, dtype=np.int64)
    else:
        ext = extend_lens_np.astype(np.int64) if extend_lens_np is not None else np.ones(n, dtype=np.int64)
        first_page = np.maximum(seq - ext + 1 - window, 0) // page_size
    counts = last_page - first_page + 1
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    total = int(indptr[-1])  # ok: FC101
    indices = np.empty(total, dtype=np.int32)
    for i in range(n):
        indices[indptr[i] : indptr[i + 1]] = block_table_np[slots_np[i], first_page[i] : last_page[i] + 1]
    last = ((seq - 1) % page_size + 1).astype(np.int32)
    return indptr, indices, last, first_page
