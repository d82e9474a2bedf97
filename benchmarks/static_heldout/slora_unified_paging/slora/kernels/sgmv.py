"""Segment metadata and the shrink/expand pair of the LoRA delta (SGMV over FlashInfer's segment GEMM)."""

from typing import Tuple

import numpy as np
import torch


def build_segments(slot_of_row: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Group consecutive rows that use the same adapter slot: (seg_indptr, weight_indices), on the host."""
    if slot_of_row.size == 0:
        return np.zeros(1, dtype=np.int32), np.zeros(0, dtype=np.int64)
    change = np.flatnonzero(np.diff(slot_of_row)) + 1
    starts = np.concatenate([[0], change]).astype(np.int64)
    seg_indptr = np.concatenate([starts, [slot_of_row.size]]).astype(np.int32)
    return seg_indptr, slot_of_row[starts].astype(np.int64)


def bgmv_delta(x: torch.Tensor, a_stack: torch.Tensor, b_stack: torch.Tensor, row_slot: torch.Tensor, scale: float):
    """Decode rows (one token each): gather every row's A and B and apply them as batched GEMVs."""
    a = a_stack.index_select(0, row_slot)
    b = b_stack.index_select(0, row_slot)
    h = torch.bmm(x.unsqueeze(1), a)
    return torch.bmm(h, b).squeeze(1) * scale


def lora_shrink_expand(sgmv_a, sgmv_b, x, a_stack, b_stack, seg_indptr, weight_indices, n_seg, scale):
    """Prompt rows: segment GEMMs, one segment per run of rows that share an adapter."""
    h = sgmv_a.run(x, a_stack, n_seg, weight_column_major=True, seg_indptr=seg_indptr, weight_indices=weight_indices)
    y = sgmv_b.run(h, b_stack, n_seg, weight_column_major=True, seg_indptr=seg_indptr, weight_indices=weight_indices)
    return y * scale


def token_slots(weight_indices: torch.Tensor, seg_lens: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Adapter slot of every row (BGMV layout), expanded on the device."""
    return torch.repeat_interleave(weight_indices, seg_lens, output_size=num_rows)  # ok: FC101
