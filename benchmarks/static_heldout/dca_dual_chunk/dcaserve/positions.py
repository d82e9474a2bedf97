"""Host-side positions for the three rotations of a DCA query and for keys."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QueryPositions:
    intra: np.ndarray  # position inside the query's own chunk
    inter: np.ndarray  # pinned at chunk_size - 1 for every row

    def stacked(self) -> np.ndarray:
        return np.stack([self.intra, self.inter]).astype(np.int64)


def decode_query_positions(seq_lens_np: np.ndarray, chunk_size: int) -> QueryPositions:
    pos = seq_lens_np.astype(np.int64) - 1
    return QueryPositions(intra=pos % chunk_size, inter=np.full_like(pos, chunk_size - 1))


def key_positions(prefix_lens_np: np.ndarray, extend_lens_np: np.ndarray, chunk_size: int) -> np.ndarray:
    """Intra-chunk positions of the new keys of a prefill batch, flattened in batch order."""
    out = [np.arange(p, p + n, dtype=np.int64) % chunk_size for p, n in zip(prefix_lens_np, extend_lens_np)]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
