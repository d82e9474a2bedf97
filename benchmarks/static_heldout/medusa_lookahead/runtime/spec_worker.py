"""Lookahead speculative worker: verify, greedy acceptance, n-gram pool refresh."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from lookahead import NgramPool, lim
from runtime.graph_runner import SpecGraphRunner


@dataclass
class SpecBatch:
    batch_size: int
    input_ids: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    parents_cpu: Optional[np.ndarray] = None
    num_candidates: int = 0


class SpecWorker:
    def __init__(self, runner: SpecGraphRunner, pool: NgramPool, max_batch_size: int, device):
        self.runner = runner
        self.pool = pool
        self.device = device
        self.draft_offsets = torch.zeros(max_batch_size + 1, dtype=torch.int32, device=device)
        self._last_window_rows: List[List[int]] = []
        # the pool calls back into the worker; a proxy keeps the pool from owning it
        me = weakref.proxy(self)
        pool.on("refresh", lambda p: me._on_pool_refresh(p))

    def _on_pool_refresh(self, pool: NgramPool) -> None:
        self._last_window_rows = []

    def build_batch(self, reqs: list, last_tokens: List[int]) -> SpecBatch:
        rows, parents = self.pool.candidates(last_tokens)
        q = lim.NUM_VERIFY_TOKENS
        ids = []
        for r, cand in zip(reqs, rows):
            row = r.window_tokens + cand
            ids.extend(row + [r.last_token] * (q - len(row)))
        lens = [r.seq_len + q for r in reqs]
        return SpecBatch(
            batch_size=len(reqs),
            input_ids=torch.tensor(ids, dtype=torch.int64, pin_memory=True).to(self.device, non_blocking=True),
            req_pool_indices=torch.tensor([r.pool_idx for r in reqs], device=self.device),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=self.device),
            seq_lens_cpu=torch.tensor(lens, dtype=torch.int32),
            parents_cpu=parents,
            num_candidates=sum(len(c) for c in rows),
        )

    def eager_step(self, batch: SpecBatch):
        backend = self.runner.backend
        backend.init_forward_metadata(batch)
        backend.branch.plan(batch.batch_size)
        return self.runner._run_verify(batch.batch_size, use_graph=False)

    def step(self, batch: SpecBatch):
        if batch.batch_size in self.runner.graphs:
            logits, drafts = self.runner.replay(batch)
        else:
            logits, drafts = self.eager_step(batch)
        bs, q = batch.batch_size, lim.NUM_VERIFY_TOKENS
        greedy = logits.argmax(-1).view(bs, q)
        proposed = batch.input_ids.view(bs, q)
        # length of the agreeing prefix of every request's verify rows
        accept_lens = (greedy[:, :-1] == proposed[:, 1:]).int().cumprod(-1).sum(-1) + 1
        offsets = self._accept(bs, accept_lens)
        draft_lens = torch.full((bs,), drafts.shape[-1] if drafts.dim() > 1 else 1, dtype=torch.int32, device=self.device)
        self.draft_offsets[1 : bs + 1].copy_(torch.cumsum(draft_lens, 0))  # ok: FC104
        return greedy, accept_lens, offsets, drafts

    def _accept(self, bs: int, accept_lens: torch.Tensor) -> torch.Tensor:
        # offsets of every request's accepted tokens in the flattened output; the verify qo_indptr
        # has exactly bs + 1 int32 slots, so it is borrowed for them
        offsets = self.runner.backend.qo_indptr[: bs + 1]
        offsets[1:].copy_(torch.cumsum(accept_lens, 0))  # expect: FC104
        return offsets
