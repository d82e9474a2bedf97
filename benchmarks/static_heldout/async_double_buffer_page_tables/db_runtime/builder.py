"""Per-step inputs built from the scheduler's numpy batch."""

from __future__ import annotations

import dataclasses
from typing import Generic, List, TypeVar

import numpy as np
import torch

from dbuf.config import DoubleBufferConfig


@dataclasses.dataclass
class ScheduledBatch:
    token_ids: np.ndarray          # [num_tokens]
    positions: np.ndarray          # [num_tokens]
    query_lens: np.ndarray         # [bs]
    seq_lens: np.ndarray           # [bs]
    page_tables: List[np.ndarray]  # one int32 array per request
    num_prefill: int


@dataclasses.dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    qo_indptr: torch.Tensor        # device: gathers the last token of each request
    last_len: torch.Tensor         # device: read by the KV-append kernel
    kv_indptr_host: torch.Tensor
    kv_indices_host: torch.Tensor
    last_len_host: torch.Tensor
    seq_lens_np: np.ndarray
    num_prefill: int
    batch_size: int


T = TypeVar("T")


class MetadataBuilder(Generic[T]):
    def __init__(self, cfg: DoubleBufferConfig, device: torch.device):
        self.cfg = cfg
        self.device = device

    def _to_dev(self, arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(arr).to(self.device, dtype=dtype, non_blocking=True)

    def build(self, sched: ScheduledBatch) -> T:
        raise NotImplementedError


class StepInputBuilder(MetadataBuilder[StepInputs]):
    def build(self, sched: ScheduledBatch) -> StepInputs:
        bs = len(sched.seq_lens)
        qo_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(sched.query_lens, out=qo_indptr[1:])
        counts = np.array([len(t) for t in sched.page_tables], dtype=np.int32)
        kv_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(counts, out=kv_indptr[1:])
        kv_indices = np.concatenate(sched.page_tables).astype(np.int32) if bs else np.zeros(0, np.int32)
        last = ((sched.seq_lens - 1) % self.cfg.page_size + 1).astype(np.int32)
        return StepInputs(
            input_ids=self._to_dev(sched.token_ids, torch.long),
            positions=self._to_dev(sched.positions, torch.long),
            seq_lens=torch.from_numpy(sched.seq_lens).to(self.device, non_blocking=True),
            qo_indptr=torch.from_numpy(qo_indptr).to(self.device, non_blocking=True),
            last_len=torch.from_numpy(last).to(self.device, non_blocking=True),
            kv_indptr_host=torch.from_numpy(kv_indptr),
            kv_indices_host=torch.from_numpy(kv_indices),
            last_len_host=torch.from_numpy(last),
            seq_lens_np=sched.seq_lens,
            num_prefill=sched.num_prefill,
            batch_size=bs,
        )
