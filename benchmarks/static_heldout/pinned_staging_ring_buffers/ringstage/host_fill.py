"""Numpy fills of a pinned slot, and the upload of its model inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence

import numpy as np
import torch

from ringstage.ring import PinnedSlot


@dataclass
class SeqState:
    rid: int
    length: int
    last_token: int
    pages: List[int] = field(default_factory=list)


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor


def fill_decode_slot(slot: PinnedSlot, seqs: Sequence[SeqState], page_size: int) -> int:
    """Write indptr, indices, last-page lengths and inputs of a decode batch into the slot; returns nnz."""
    n = len(seqs)
    lens = np.array([s.length for s in seqs], dtype=np.int32)
    pages = (lens + page_size - 1) // page_size
    indptr_np = slot.kv_indptr.numpy()
    indptr_np[0] = 0
    np.cumsum(pages, out=indptr_np[1 : n + 1])
    nnz = int(indptr_np[n])
    slot.ensure_indices(nnz)
    idx_np = slot.kv_indices.numpy()
    for i, s in enumerate(seqs):
        idx_np[indptr_np[i] : indptr_np[i + 1]] = s.pages[: pages[i]]
    slot.last_page_len.numpy()[:n] = (lens - 1) % page_size + 1
    slot.seq_lens.numpy()[:n] = lens
    slot.positions.numpy()[:n] = lens - 1
    slot.input_ids.numpy()[:n] = [s.last_token for s in seqs]
    slot.slot_mapping.numpy()[:n] = [s.pages[(s.length - 1) // page_size] * page_size + (s.length - 1) % page_size for s in seqs]
    return nnz


def pages_needed(seq_lens: torch.Tensor, page_size: int) -> int:
    return int(((seq_lens + page_size - 1) // page_size).sum())  # expect: FC101


def upload_inputs(slot: PinnedSlot, rows: int, device: torch.device) -> StepInputs:
    return StepInputs(
        input_ids=slot.input_ids[:rows].to(device, non_blocking=True),
        positions=slot.positions[:rows].to(device, non_blocking=True),
    )
