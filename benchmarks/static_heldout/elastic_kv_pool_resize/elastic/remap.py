"""Host-side page id remapping after a shrink compacted the pool."""

from __future__ import annotations

from typing import List

import numpy as np


def remap_page_tables(tables: List[np.ndarray], mapping: np.ndarray) -> List[np.ndarray]:
    """``mapping[old] = new`` (or -1 for a page that no longer exists)."""
    out = []
    for t in tables:
        new = mapping[t]
        if (new < 0).any():
            raise ValueError("a live request references a page the shrink dropped")
        out.append(new.astype(np.int32))
    return out
