from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from kvguard import PageTable


@dataclass
class StepMeta:
    batch_size: int
    num_pages: int
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    positions: torch.Tensor
    rebuilt: Optional[PageTable] = None


def build_step_meta(page_lists: Sequence[List[int]], kv_lens_cpu: torch.Tensor, page_size: int,
                    indptr_pinned: torch.Tensor, last_pinned: torch.Tensor,
                    indices_staging: torch.Tensor) -> StepMeta:
    bs = len(page_lists)
    flat = [p for pages in page_lists for p in pages]
    indptr_pinned[0] = 0
    indptr_pinned[1 : bs + 1] = torch.tensor([len(p) for p in page_lists], dtype=torch.int32).cumsum(0)
    last_pinned[:bs] = (kv_lens_cpu - 1) % page_size + 1
    indices_staging[: len(flat)].copy_(torch.tensor(flat, dtype=torch.int32), non_blocking=True)
    return StepMeta(
        batch_size=bs,
        num_pages=len(flat),
        kv_indptr_cpu=indptr_pinned,
        kv_indices=indices_staging[: len(flat)],
        kv_last_page_len_cpu=last_pinned,
        positions=(kv_lens_cpu - 1).to(indices_staging.device, non_blocking=True),
    )
