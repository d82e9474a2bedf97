from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch


@dataclass
class Request:
    rid: int
    pages: List[int]
    kv_len: int
    output_ids: List[int] = field(default_factory=list)
    strength: float = 1.0


class StepInputs:
    """Built fresh for every decode step from the running requests."""

    def __init__(self, reqs: List[Request], page_size: int, device: torch.device):
        self.bs = len(reqs)
        lens = np.fromiter((r.kv_len for r in reqs), dtype=np.int32, count=self.bs)
        counts = np.fromiter((len(r.pages) for r in reqs), dtype=np.int32, count=self.bs)
        indptr = np.zeros(self.bs + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        self.kv_indptr_host = torch.from_numpy(indptr)
        self.kv_indptr = self.kv_indptr_host.to(device, non_blocking=True)
        self.kv_indices = torch.from_numpy(np.concatenate([np.asarray(r.pages, dtype=np.int32) for r in reqs])).to(device)
        self.kv_last_page_len_host = torch.from_numpy(((lens - 1) % page_size + 1).astype(np.int32))
        self.prev_tokens = torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.int64, device=device)  # ok: FC107
        self.positions = torch.from_numpy(lens.astype(np.int64) - 1).to(device, non_blocking=True)
        self.kv_lens_next = torch.from_numpy(lens + 1).to(device, non_blocking=True)
        self.strength = torch.tensor([r.strength for r in reqs], dtype=torch.float32, device=device)


@dataclass
class PrefillInputs:
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_host: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    max_q_len: int
    max_kv_len: int
