"""The per-step batch handed from the scheduler to the model runner."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    seq_lens_cpu: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    is_decode: bool = True
    shared_prefix: bool = False
    scratch: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return self.seq_lens_cpu.shape[0]


@torch.jit.script
def window_indptr(kv_indptr: torch.Tensor, window_pages: int) -> torch.Tensor:
    assert window_pages > 0  # ok: FC109
    pages = torch.clamp(kv_indptr[1:] - kv_indptr[:-1], max=window_pages)
    return torch.cat([kv_indptr[:1], torch.cumsum(pages, 0).to(kv_indptr.dtype)])
