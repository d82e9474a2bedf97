"""Per-step batch description: device tensors plus the pinned mirrors the planners read."""

from dataclasses import dataclass
from typing import List, Sequence

import torch


@dataclass
class MixedBatchInfo:
    num_reqs: int
    num_decode: int
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_lens: torch.Tensor
    kv_lens_cpu: torch.Tensor
    qo_lens: torch.Tensor
    last_page_len_cpu: torch.Tensor
    positions: torch.Tensor

    @property
    def decode_only(self) -> bool:
        return self.num_decode == self.num_reqs

    @property
    def max_q_len(self) -> int:
        return int(self.qo_lens.max())  # expect: FC101


class StepScratch:
    """Scratch tensors that live for one step only."""

    def __init__(self, num_tokens: int, num_reqs: int, device: torch.device):
        self.logits_idx = torch.empty(num_reqs, dtype=torch.long, device=device)  # ok: FC107
        self.num_tokens = num_tokens


def _pinned(values: Sequence[int]) -> torch.Tensor:
    t = torch.empty(len(values), dtype=torch.int32, pin_memory=True)
    t.copy_(torch.tensor(values, dtype=torch.int32))
    return t


def build_batch_info(qo_lens: List[int], kv_lens: List[int], page_lists: List[List[int]], num_decode: int,
                     page_size: int, device: torch.device) -> MixedBatchInfo:
    qo_indptr, kv_indptr, flat_pages, last = [0], [0], [], []
    for q, kv, pages in zip(qo_lens, kv_lens, page_lists):
        qo_indptr.append(qo_indptr[-1] + q)
        kv_indptr.append(kv_indptr[-1] + len(pages))
        flat_pages.extend(pages)
        last.append((kv - 1) % page_size + 1)
    positions = [kv - q + i for q, kv in zip(qo_lens, kv_lens) for i in range(q)]
    qo_indptr_cpu = _pinned(qo_indptr)
    kv_indptr_cpu = _pinned(kv_indptr)
    kv_lens_cpu = _pinned(kv_lens)
    return MixedBatchInfo(
        num_reqs=len(qo_lens),
        num_decode=num_decode,
        qo_indptr=qo_indptr_cpu.to(device, non_blocking=True),
        qo_indptr_cpu=qo_indptr_cpu,
        kv_indptr=kv_indptr_cpu.to(device, non_blocking=True),
        kv_indptr_cpu=kv_indptr_cpu,
        kv_indices=_pinned(flat_pages).to(device, non_blocking=True),
        kv_lens=kv_lens_cpu.to(device, non_blocking=True),
        kv_lens_cpu=kv_lens_cpu,
        qo_lens=_pinned(qo_lens).to(device, non_blocking=True),
        last_page_len_cpu=_pinned(last),
        positions=_pinned(positions).to(device=device, dtype=torch.long, non_blocking=True),
    )
