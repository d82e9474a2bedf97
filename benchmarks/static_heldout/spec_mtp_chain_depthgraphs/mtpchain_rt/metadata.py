"""Per-step metadata for the target verify pass, the draft tail and the chain state."""

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class TargetMetadata:
    """Target model verify pass: every request scores ``1 + num_mtp_heads`` tokens."""

    qo_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    num_tokens: int


@dataclass
class TailMetadata:
    """Pages written by earlier depths of this step, not yet committed to the pool."""

    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_device: torch.Tensor


@dataclass
class DraftState:
    live: torch.Tensor
    depth_reached: int = 0
    note: Optional[str] = None

    @property
    def num_live(self) -> int:
        return int(self.live.sum())  # expect: FC101


def pages_for(lens_np: np.ndarray, page_size: int) -> np.ndarray:
    return (lens_np + page_size - 1) // page_size


def build_target_metadata(
    seq_lens_np: np.ndarray, page_table: torch.Tensor, num_spec: int, page_size: int, device
) -> TargetMetadata:
    bs = seq_lens_np.shape[0]
    q_lens = torch.full((bs,), num_spec + 1, dtype=torch.int32, device=device)
    qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=device)
    torch.cumsum(q_lens, dim=0, out=qo_indptr[1:])
    total_lens = seq_lens_np + num_spec + 1
    num_pages = pages_for(total_lens, page_size)
    kv_indptr_np = np.zeros(bs + 1, dtype=np.int32)
    np.cumsum(num_pages, out=kv_indptr_np[1:])
    last_np = (total_lens - 1) % page_size + 1
    rows = [page_table[i, : int(num_pages[i])] for i in range(bs)]
    return TargetMetadata(
        qo_indptr=qo_indptr,
        kv_indptr_cpu=torch.from_numpy(kv_indptr_np),
        kv_indices=torch.cat(rows) if rows else page_table.new_zeros(0),
        last_page_len_cpu=torch.from_numpy(last_np.astype(np.int32)),
        num_tokens=bs * (num_spec + 1),
    )


def build_tail_metadata(tail_pages: List[np.ndarray], tail_lens_np: np.ndarray, device) -> TailMetadata:
    counts = np.array([len(p) for p in tail_pages], dtype=np.int32)
    indptr = np.zeros(len(tail_pages) + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    flat = np.concatenate(tail_pages) if tail_pages else np.zeros(0, dtype=np.int32)
    return TailMetadata(
        kv_indptr_cpu=torch.from_numpy(indptr),
        kv_indices=torch.from_numpy(flat).to(device, non_blocking=True),
        last_page_len_device=torch.from_numpy(tail_lens_np.astype(np.int32)).to(device, non_blocking=True),
    )


def longest_chain(accept_lens) -> int:
    # used to decide how many depths need their pages kept
    return int(accept_lens.max())  # expect: FC101
