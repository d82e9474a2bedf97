"""Verify masks: each row's query is its last accepted token followed by its draft branches."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _check_mask(mask: np.ndarray, q_len: int, kv_len: int) -> None:
    assert mask.shape == (q_len, kv_len), "mask does not match the verify query"  # expect: FC109


def build_verify_mask(branches: Sequence[Sequence[Sequence[int]]], cached_lens: Sequence[int]) -> np.ndarray:
    """Flattened boolean masks, row after row, in FlashInfer's custom_mask layout.

    The `s` cached tokens and the last accepted token (kv position `s`) are visible to every query;
    a draft token also sees the tokens before it in its own branch, never those of another branch.
    """
    parts = []
    for row_branches, s in zip(branches, cached_lens):
        q_len = 1 + sum(len(b) for b in row_branches)
        kv_len = s + q_len
        mask = np.zeros((q_len, kv_len), dtype=bool)
        mask[:, : s + 1] = True
        off = 1
        for b in row_branches:
            for j in range(len(b)):
                mask[off + j, s + off : s + off + j + 1] = True
            off += len(b)
        _check_mask(mask, q_len, kv_len)
        parts.append(mask.ravel())
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
