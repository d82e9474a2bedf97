"""Cumsum / indptr builders."""

import numpy as np
import torch


def cumsum_indptr(lens):
    """``[0, l0, l0 + l1, ...]``: numpy in, numpy out; a tensor in, a tensor out on its device."""
    if isinstance(lens, np.ndarray):
        out = np.zeros(lens.shape[0] + 1, dtype=np.int32)
        np.cumsum(lens, out=out[1:])
        return out
    out = torch.zeros(lens.shape[0] + 1, dtype=torch.int32, device=lens.device)
    torch.cumsum(lens, dim=0, dtype=torch.int32, out=out[1:])
    return out


def indptr_from_counts_into(out, counts):
    """Write the indptr of ``counts`` into ``out`` (``len(counts) + 1`` entries) in place."""
    out[0] = 0
    torch.cumsum(counts, dim=0, dtype=torch.int32, out=out[1:])
    return out


def segment_starts(indptr):
    """Start offset of every segment as Python ints (prompt spans, chunk bookkeeping)."""
    return indptr[:-1].tolist()  # expect: FC101
