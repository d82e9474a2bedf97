"""The per-step decode batch: numpy first, then one device copy of each field."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np
import torch

from .kv import PagedKV
from .params import Request


@dataclasses.dataclass
class DecodeBatch:
    reqs: List[Request]
    slots: torch.Tensor
    positions: torch.Tensor
    temps: torch.Tensor
    seeded: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    num_logprobs_np: np.ndarray
    graph_bs: Optional[int] = None

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    @property
    def needs_logprobs(self) -> bool:
        return bool(self.num_logprobs_np.any())

    @classmethod
    def build(cls, reqs: List[Request], kv: PagedKV, device: torch.device) -> "DecodeBatch":
        n = len(reqs)
        seq_lens = np.fromiter((r.seq_len for r in reqs), dtype=np.int32, count=n)
        indptr, indices, last = kv.csr(reqs, seq_lens)
        slots = np.fromiter((r.slot for r in reqs), dtype=np.int64, count=n)
        temps = np.fromiter((r.params.temperature for r in reqs), dtype=np.float32, count=n)
        seeded = np.fromiter((r.params.seed is not None for r in reqs), dtype=np.bool_, count=n)
        nlp = np.fromiter((r.params.logprobs for r in reqs), dtype=np.int32, count=n)
        kv_indptr_cpu = torch.from_numpy(indptr).pin_memory()
        last_cpu = torch.from_numpy(last).pin_memory()
        return cls(
            reqs=reqs,
            slots=torch.from_numpy(slots).to(device, non_blocking=True),
            positions=torch.from_numpy(seq_lens.astype(np.int64) - 1).to(device, non_blocking=True),
            temps=torch.from_numpy(temps).to(device, non_blocking=True),
            seeded=torch.from_numpy(seeded).to(device, non_blocking=True),
            kv_indptr=kv_indptr_cpu.to(device, non_blocking=True),
            kv_indices=torch.from_numpy(indices).to(device, non_blocking=True),
            kv_last_page_len=last_cpu.to(device, non_blocking=True),
            kv_indptr_cpu=kv_indptr_cpu,
            kv_last_page_len_cpu=last_cpu,
            num_logprobs_np=nlp,
        )
