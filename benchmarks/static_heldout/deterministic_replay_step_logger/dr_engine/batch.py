"""Per-step batch and its builder."""

from __future__ import annotations

import dataclasses
from typing import List

import numpy as np
import torch

from dr_engine.config import EngineConfig


@dataclasses.dataclass
class ScheduleOutput:
    token_ids: np.ndarray
    positions: np.ndarray
    query_lens: np.ndarray
    seq_lens: np.ndarray
    page_tables: List[np.ndarray]
    num_prefill: int


@dataclasses.dataclass
class StepBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indices: torch.Tensor
    input_ids_np: np.ndarray
    positions_np: np.ndarray
    seq_lens_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices_cpu: torch.Tensor
    last_len_cpu: torch.Tensor
    num_prefill: int
    batch_size: int

    @property
    def max_seq_len(self) -> torch.Tensor:
        return self.seq_lens.max()


class StepBatchBuilder:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device

    def build(self, sched: ScheduleOutput) -> StepBatch:
        bs = len(sched.seq_lens)
        qo_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(sched.query_lens, out=qo_np[1:])
        counts = np.array([len(t) for t in sched.page_tables], dtype=np.int32)
        kv_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(counts, out=kv_indptr[1:])
        kv_indices = np.concatenate(sched.page_tables).astype(np.int32) if bs else np.zeros(0, np.int32)
        last = ((sched.seq_lens - 1) % self.cfg.page_size + 1).astype(np.int32)
        with torch.device(self.device):
            input_ids = torch.tensor(sched.token_ids, dtype=torch.long)
            positions = torch.tensor(sched.positions, dtype=torch.long)
            seq_lens = torch.tensor(sched.seq_lens, dtype=torch.int32)
            qo_indptr = torch.tensor(qo_np, dtype=torch.int32)
            kv_indices_dev = torch.tensor(kv_indices, dtype=torch.int32)
        return StepBatch(
            input_ids=input_ids,
            positions=positions,
            seq_lens=seq_lens,
            qo_indptr=qo_indptr,
            kv_indices=kv_indices_dev,
            input_ids_np=sched.token_ids,
            positions_np=sched.positions,
            seq_lens_cpu=torch.from_numpy(sched.seq_lens),
            kv_indptr_cpu=torch.from_numpy(kv_indptr),
            kv_indices_cpu=torch.from_numpy(kv_indices),
            last_len_cpu=torch.from_numpy(last),
            num_prefill=sched.num_prefill,
            batch_size=bs,
        )
