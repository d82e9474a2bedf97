from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch

from prmscore.config import ScoreConfig

logger = logging.getLogger(__name__)


@dataclass
class Candidate:
    question_id: int
    token_ids: List[int]
    pages: List[int]          # candidate's own pages, after the shared question pages


@dataclass
class QuestionEntry:
    question_id: int
    num_tokens: int
    pages: List[int]


@dataclass
class ScoreBatch:
    num_cands: int
    num_tokens: int
    input_ids: torch.Tensor          # device, candidate tokens packed
    positions: torch.Tensor          # device
    qo_indptr_cpu: torch.Tensor      # pinned
    kv_indptr_cpu: torch.Tensor      # pinned
    kv_indices: torch.Tensor         # device
    last_page_len_cpu: torch.Tensor  # pinned
    last_page_len: torch.Tensor      # device copy, read by the pooler's length check
    step_counts: torch.Tensor        # device, step tags per candidate
    step_seg_indptr_cpu: torch.Tensor  # pinned, offsets of each candidate's step tags
    step_positions: Optional[torch.Tensor] = None
    step_seg_indptr: Optional[torch.Tensor] = None


class ScoreBatchBuilder:
    """Builds the per-step ScoreBatch; runs once per scoring step."""

    def __init__(self, cfg: ScoreConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.qo_indptr_cpu = torch.zeros(cfg.graph_max_cands * 8 + 1, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_np = self.qo_indptr_cpu.numpy()
        self.step_positions = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=device)
        self.step_counts_cpu = torch.zeros(1, dtype=torch.int32, pin_memory=True)

    def build(self, cands: Sequence[Candidate], questions: dict) -> ScoreBatch:
        n = len(cands)
        lens = np.array([len(c.token_ids) for c in cands], dtype=np.int32)
        qo = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lens, out=qo[1:])
        total = int(qo[-1])  # ok: FC101

        kv_pages = []
        kv_lens = []
        for c in cands:
            q = questions[c.question_id]
            kv_pages.append(np.asarray(q.pages + c.pages, dtype=np.int32))
            kv_lens.append(q.num_tokens + len(c.token_ids))
        kv_lens_np = np.asarray(kv_lens, dtype=np.int32)
        npages = np.asarray([len(p) for p in kv_pages], dtype=np.int32)
        kv_indptr = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(npages, out=kv_indptr[1:])
        last = kv_lens_np - (npages - 1) * self.cfg.page_size

        ids = torch.from_numpy(np.concatenate([np.asarray(c.token_ids) for c in cands]).astype(np.int64))
        input_ids = ids.to(self.device, non_blocking=True)
        pos = np.concatenate([np.arange(questions[c.question_id].num_tokens,
                                        questions[c.question_id].num_tokens + len(c.token_ids)) for c in cands])
        last_cpu = torch.from_numpy(last).pin_memory()

        tag = self.cfg.step_tag_id
        steps_np = np.asarray([sum(1 for t in c.token_ids if t == tag) for c in cands], dtype=np.int32)
        seg_np = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(steps_np, out=seg_np[1:])
        is_step = input_ids == tag
        num_steps = int(is_step.sum())  # expect: FC101
        logger.debug("score batch: %d candidates, %d tokens, step tags %s", n, total, is_step)  # ok: FC101
        if self.step_counts_cpu.numel() < n:
            self.step_counts_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)  # ok: FC107
        if num_steps > self.step_positions.numel():
            self.step_positions = torch.zeros(num_steps, dtype=torch.int64, device=self.device)  # expect: FC107

        return ScoreBatch(
            num_cands=n,
            num_tokens=total,
            input_ids=input_ids,
            positions=torch.from_numpy(pos).to(self.device, non_blocking=True),
            qo_indptr_cpu=torch.from_numpy(qo).pin_memory(),
            kv_indptr_cpu=torch.from_numpy(kv_indptr).pin_memory(),
            kv_indices=torch.from_numpy(np.concatenate(kv_pages)).to(self.device, non_blocking=True),
            last_page_len_cpu=last_cpu,
            last_page_len=last_cpu.to(self.device, non_blocking=True),
            step_counts=torch.from_numpy(steps_np).to(self.device, non_blocking=True),
            step_seg_indptr_cpu=torch.from_numpy(seg_np).pin_memory(),
        )
