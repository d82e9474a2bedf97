"""Rank 0's scheduler: it alone owns the page allocator and forms each step's batch."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List

import numpy as np
import torch

from tpdist.config import TPConfig


@dataclass
class Sequence:
    sid: int
    token_ids: List[int]
    pages: List[int] = field(default_factory=list)
    prefilled: bool = False

    @property
    def length(self) -> int:
        return len(self.token_ids)


@dataclass
class StepPlan:
    header_cpu: torch.Tensor  # [rows, pages, tokens, is_prefill]
    seq_lens_np: np.ndarray
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_cpu: torch.Tensor
    kv_indices_cpu: torch.Tensor
    input_ids_cpu: torch.Tensor
    positions_cpu: torch.Tensor


class Rank0Scheduler:
    def __init__(self, cfg: TPConfig):
        self.cfg = cfg
        self.waiting: Deque[Sequence] = deque()
        self.running: List[Sequence] = []
        self.free_pages: List[int] = list(range(cfg.max_pages - 1, -1, -1))
        self.headroom: List[int] = [0] * cfg.world_size

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def update_headroom(self, per_rank: List[int]) -> None:
        self.headroom = per_rank

    def _grow(self, seq: Sequence) -> None:
        need = -(-seq.length // self.cfg.page_size) - len(seq.pages)
        for _ in range(need):
            seq.pages.append(self.free_pages.pop())

    def schedule(self) -> StepPlan:
        prefill = bool(self.waiting) and min(self.headroom) > 0
        if prefill:
            batch = [self.waiting.popleft()]
            self.running.extend(batch)
        else:
            batch = self.running[: self.cfg.max_batch]
        for seq in batch:
            self._grow(seq)
        lens_np = np.array([s.length for s in batch], dtype=np.int32)
        max_len = int(lens_np.max())  # ok: FC101
        if max_len > self.cfg.max_pages * self.cfg.page_size:
            raise RuntimeError(f"sequence of {max_len} tokens exceeds the KV pool")
        q_np = lens_np if prefill else np.ones_like(lens_np)
        pages_np = np.array([len(s.pages) for s in batch], dtype=np.int32)
        ids = [t for s in batch for t in (s.token_ids if prefill else s.token_ids[-1:])]
        pos = [p for s in batch for p in (range(s.length) if prefill else [s.length - 1])]
        indices = [p for s in batch for p in s.pages]
        header = torch.tensor([len(batch), len(indices), len(ids), int(prefill)], dtype=torch.int64)
        return StepPlan(
            header_cpu=header,
            seq_lens_np=lens_np,
            qo_indptr_cpu=torch.from_numpy(np.concatenate([[0], np.cumsum(q_np)]).astype(np.int32)),
            kv_indptr_cpu=torch.from_numpy(np.concatenate([[0], np.cumsum(pages_np)]).astype(np.int32)),
            last_page_cpu=torch.from_numpy(((lens_np - 1) % self.cfg.page_size + 1).astype(np.int32)),
            kv_indices_cpu=torch.tensor(indices, dtype=torch.int32),
            input_ids_cpu=torch.tensor(ids, dtype=torch.int64),
            positions_cpu=torch.tensor(pos, dtype=torch.int64),
        )
