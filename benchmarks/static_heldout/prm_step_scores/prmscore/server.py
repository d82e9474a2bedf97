from __future__ import annotations

import logging
from collections import deque
from typing import Deque, Dict, List, Sequence

import numpy as np
import torch

from prmscore.attention import PrmAttnBackend
from prmscore.batch import Candidate, QuestionEntry, ScoreBatchBuilder
from prmscore.config import ScoreConfig
from prmscore.graph_runner import ScoreGraphRunner
from prmscore.model import PrmModel

logger = logging.getLogger(__name__)


class PagePool:
    def __init__(self, num_pages: int):
        self.free: Deque[int] = deque(range(num_pages))

    def take(self, n: int) -> List[int]:
        if n > len(self.free):
            raise MemoryError(f"need {n} pages, {len(self.free)} free")
        return [self.free.popleft() for _ in range(n)]

    def give(self, pages: Sequence[int]) -> None:
        self.free.extend(pages)


class ScoreServer:
    def __init__(self, cfg: ScoreConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.max_candidates = cfg.max_candidates
        self.step_tag_id = cfg.step_tag_id
        self.attn = PrmAttnBackend(cfg, device)
        self.model = PrmModel(cfg, self.attn).to(device, dtype=torch.bfloat16)
        self.kv_caches = [
            torch.zeros(cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                        dtype=torch.bfloat16, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.pages = PagePool(cfg.max_pages)
        self.builder = ScoreBatchBuilder(cfg, device)
        self.graphs = ScoreGraphRunner(cfg, self.model, self.attn, self.kv_caches, device)
        self.questions: Dict[int, QuestionEntry] = {}
        self.pending: List[Candidate] = []
        self._next_qid = 0

    def submit(self, question_ids: List[int], candidates: List[List[int]]) -> int:
        assert len(candidates) <= self.max_candidates, "too many candidates"  # expect: FC109
        assert self.step_tag_id is not None  # ok: FC109
        qid = self._next_qid
        self._next_qid += 1
        ps = self.cfg.page_size
        q_pages = self.pages.take((len(question_ids) + ps - 1) // ps)
        self.questions[qid] = QuestionEntry(qid, len(question_ids), q_pages)
        self._prefill_question(self.questions[qid], question_ids)
        for cand in candidates:
            self.pending.append(Candidate(qid, cand, self.pages.take((len(cand) + ps - 1) // ps)))
        return qid

    def _prefill_question(self, q: QuestionEntry, token_ids: List[int]) -> None:
        qo = torch.tensor([0, len(token_ids)], dtype=torch.int32, pin_memory=True)
        self.attn.plan_question(q, qo)

    def _pack(self) -> List[Candidate]:
        taken = self.pending[: self.cfg.graph_max_cands * 4]
        self.pending = self.pending[len(taken):]
        assert sum(len(c.token_ids) for c in taken) <= self.cfg.max_num_tokens  # ok: FC109
        return taken

    def score_step(self) -> torch.Tensor:
        cands = self._pack()
        batch = self.builder.build(cands, self.questions)
        bucket = self.graphs.bucket_for(batch)
        if bucket is not None:
            return self.graphs.replay(batch, bucket)
        self.attn.init_forward_metadata(batch)
        pos = torch.from_numpy(np.flatnonzero(np.concatenate([np.asarray(c.token_ids) for c in cands])
                                              == self.step_tag_id)).to(self.device, non_blocking=True)
        return self.model(batch.input_ids, self.kv_caches, pos, batch.step_counts, batch.num_cands)

    def score_requests(self) -> Dict[int, List[float]]:
        scores = self.score_step()
        out: Dict[int, List[float]] = {}
        flat = scores.float().tolist()  # ok: FC101
        return {0: flat} if flat else out
