"""The reasoning engine: per-request thinking budgets enforced by a sampler hook."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from reasoning import BudgetTracker, ReasoningConfig, ThinkingBudgetHook
from rb_attn.backend import BatchMeta, ReasoningAttnBackend
from rb_run.graphs import BucketGraphRunner
from rb_run.model import ReasoningLM
from rb_run.sampler import Sampler

logger = logging.getLogger(__name__)


@dataclass
class Request:
    rid: int
    token_ids: List[int]
    pages: List[int] = field(default_factory=list)
    row: int = -1
    thinking_done: bool = False


class ReasoningEngine:
    def __init__(self, cfg: ReasoningConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.tracker = BudgetTracker(cfg, device)
        self.hook = ThinkingBudgetHook(self.tracker, cfg.vocab_size, cfg.max_running, device)
        self.sampler = Sampler([self.hook])
        self.backend = ReasoningAttnBackend(cfg, device)
        kv_caches = [
            torch.zeros(cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                        dtype=torch.bfloat16, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.model = ReasoningLM(cfg, self.backend, kv_caches, device)
        self.runner = BucketGraphRunner(cfg, self.backend, self.model, device)
        self.tokens_host = torch.zeros(cfg.max_running, dtype=torch.int64, pin_memory=True)
        self.finished_host = torch.zeros(cfg.max_running, dtype=torch.bool, pin_memory=True)
        self.copy_event = torch.cuda.Event()
        self.running: List[Request] = []
        self.free_rows = list(range(cfg.max_running - 1, -1, -1))
        self.step_idx = 0

    def add_request(self, req: Request, budget: Optional[int] = None) -> None:
        req.row = self.free_rows.pop()
        self.tracker.admit(req.row, budget or self.cfg.default_budget)
        self.running.append(req)

    def _meta(self, reqs: List[Request], prefill: bool) -> BatchMeta:
        lens = np.array([len(r.token_ids) for r in reqs], dtype=np.int32)
        pages = np.array([len(r.pages) for r in reqs], dtype=np.int32)
        q = lens if prefill else np.ones_like(lens)
        return BatchMeta(
            batch_size=len(reqs),
            num_pages=int(pages.sum()),
            qo_indptr_cpu=torch.from_numpy(np.concatenate([[0], np.cumsum(q)]).astype(np.int32)),
            kv_indptr_cpu=torch.from_numpy(np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)),
            last_page_cpu=torch.from_numpy(((lens - 1) % self.cfg.page_size + 1).astype(np.int32)),
            kv_indices=torch.tensor([p for r in reqs for p in r.pages], dtype=torch.int32).to(self.device),
        )

    def prefill(self, req: Request) -> torch.Tensor:
        meta = self._meta([req], prefill=True)
        self.backend.init_forward_metadata(meta)
        ids = torch.tensor(req.token_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        pos = torch.arange(len(req.token_ids), device=self.device)
        return self.model.forward_prefill(ids, pos)

    def step(self) -> None:
        reqs = self.running[: self.cfg.max_running]
        bs = len(reqs)
        meta = self._meta(reqs, prefill=False)
        ids = torch.tensor([r.token_ids[-1] for r in reqs], dtype=torch.int64).to(self.device, non_blocking=True)
        pos = torch.tensor([len(r.token_ids) - 1 for r in reqs], dtype=torch.int64).to(self.device, non_blocking=True)
        forced = self.tracker.pending_end[:bs]
        if bs <= self.cfg.largest_bucket:
            logits = self.runner.replay(ids, pos, meta, forced)
        else:
            self.backend.plan_eager(meta)
            logits = self.model.forward_decode(ids, pos, forced)
        sampled = self.sampler.sample(logits, bs)
        self.tracker.update(sampled, bs)
        if bs <= self.cfg.largest_bucket:
            # the forced end-of-thinking token takes a slot in each exhausted row's last page
            self.backend.last_page_device[:bs].add_(self.tracker.pending_end[:bs].to(torch.int32))  # expect: FC104
        self.tokens_host[:bs].copy_(sampled, non_blocking=True)  # ok: FC101
        self.copy_event.record()
        self.finished_host[:bs].copy_(self.tracker.finished[:bs])  # expect: FC101
        logger.info(f"step {self.step_idx}: thinking tokens used {self.tracker.think_used[:bs]}")  # expect: FC101
        logger.debug("thinking budgets %s", self.tracker.think_budget[:bs])  # ok: FC101
        for r in reqs:
            if int(self.tracker.used_np[r.row]) >= int(self.tracker.budget_np[r.row]):  # ok: FC101
                r.thinking_done = True
        self.step_idx += 1

    def drain(self) -> List[int]:
        self.copy_event.synchronize()
        return self.tokens_host.tolist()

    def debug_plan_info(self):
        return self.backend.prefill_wrapper._plan_info  # expect: FC103
