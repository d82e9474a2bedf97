"""SGMV segments: requests grouped by adapter slot, rebuilt every step."""
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch


@dataclass
class SegmentInfo:
    seg_indptr: torch.Tensor            # [num_segments + 1] token offsets, device
    weight_indices: torch.Tensor        # [num_segments] adapter slot per segment, device
    seg_lens_cpu: torch.Tensor
    max_rank: int
    num_tokens: int
    token_slots: Optional[torch.Tensor] = None


def group_by_adapter(slot_ids_np: np.ndarray, tokens_per_req_np: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scheduler already orders requests by slot; collapse runs of equal slots into segments."""
    if slot_ids_np.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32)
    change = np.flatnonzero(np.diff(slot_ids_np)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [slot_ids_np.size]])
    tok_cum = np.concatenate([[0], np.cumsum(tokens_per_req_np)])
    seg_lens = (tok_cum[ends] - tok_cum[starts]).astype(np.int32)
    return starts, slot_ids_np[starts].astype(np.int32), seg_lens
