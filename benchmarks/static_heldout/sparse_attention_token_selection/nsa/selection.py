"""Top-k page selection and the sparse page lists it produces."""

from __future__ import annotations

import numpy as np
import torch


def select_topk_blocks(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k best pages per row; -1 where a row has fewer than k pages."""
    assert k > 0, "top-k must be positive"  # expect: FC109
    k = min(k, scores.shape[1])
    vals, idx = torch.topk(scores, k, dim=1)
    return torch.where(torch.isinf(vals), torch.full_like(idx, -1), idx)


def count_selected(topk_idx: torch.Tensor) -> torch.Tensor:
    return (topk_idx >= 0).sum(dim=1, dtype=torch.int32)


def pages_from_blocks(block_table: torch.Tensor, topk_idx: torch.Tensor) -> torch.Tensor:
    """Flattened physical page ids of the selected blocks, request by request."""
    pages = torch.gather(block_table[: topk_idx.shape[0]], 1, topk_idx.clamp(min=0))
    return pages[topk_idx >= 0]  # expect: FC101


def write_sparse_indptr(indptr_out: torch.Tensor, counts: torch.Tensor) -> None:
    torch.cumsum(counts, 0, out=indptr_out[1:])


def host_selected_counts(num_pages_np: np.ndarray, k: int) -> np.ndarray:
    """With a fixed top-k the per-request counts are known on the host before the step."""
    return np.minimum(num_pages_np, k).astype(np.int32)


def flat_gather_index(counts_np: np.ndarray, k: int) -> np.ndarray:
    rows = np.repeat(np.arange(counts_np.shape[0], dtype=np.int64), counts_np)
    starts = np.concatenate([[0], np.cumsum(counts_np)[:-1]]).astype(np.int64)
    cols = np.arange(int(counts_np.sum()), dtype=np.int64) - np.repeat(starts, counts_np)
    return rows * k + cols
