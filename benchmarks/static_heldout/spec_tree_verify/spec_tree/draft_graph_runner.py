"""CUDA graphs over the draft head's ``num_draft_steps`` decode steps, one per batch size."""

from __future__ import annotations

import logging
from typing import Dict, Optional

import numpy as np
import torch
from torch import nn

from spec_tree.attention.draft_backend import DraftDecodeBackend
from spec_tree.config import SpecConfig

logger = logging.getLogger(__name__)


class EagleDraftHead(nn.Module):
    def __init__(self, cfg: SpecConfig, hidden: int, vocab: int):
        super().__init__()
        self.q_proj = nn.Linear(hidden, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, hidden, bias=False)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.num_heads, self.head_dim = cfg.num_qo_heads, cfg.head_dim


class DraftGraphRunner:
    def __init__(self, draft_backend: DraftDecodeBackend, draft_head: EagleDraftHead, kv_cache: torch.Tensor, cfg: SpecConfig):
        self.draft_backend = draft_backend
        self.draft_head = draft_head
        self.kv_cache = kv_cache
        self.cfg = cfg
        self.topk = cfg.topk
        self.num_steps = cfg.num_draft_steps
        self.capture_bs = list(cfg.capture_bs)
        self.max_bs = max(self.capture_bs)
        self.device = kv_cache.device
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self._fixed_batch_size: Optional[int] = None  # ok: FC103
        hidden = draft_head.o_proj.out_features
        self.hidden_states = torch.zeros(self.max_bs * self.topk, hidden, dtype=cfg.dtype, device=self.device)
        self.draft_out: Optional[torch.Tensor] = None

    def _run_steps(self, bs: int) -> torch.Tensor:
        n = bs * self.topk
        h = self.hidden_states[:n]
        for step in range(self.num_steps):
            q = self.draft_head.q_proj(h).view(n, self.draft_head.num_heads, self.draft_head.head_dim)
            o = self.draft_backend.forward(q, self.kv_cache)
            h = self.draft_head.o_proj(o.view(n, -1))
            self.draft_out[:n, step] = self.draft_head.lm_head(h).argmax(-1)
        return self.draft_out[:n]

    def record_graphs(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.capture_bs):
            if self.draft_out is None:
                self.draft_out = torch.empty(  # ok: FC107
                    (self.max_bs * self.topk, self.num_steps), dtype=torch.int64, device=self.device
                )
            n = bs * self.topk
            self.draft_backend.plan_step(n, np.ones(n, dtype=np.int32), np.ones(n, dtype=np.int32))
            for _ in range(2):
                self._run_steps(bs)
            torch.cuda.synchronize()  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._run_steps(bs)
            self.graphs[bs] = graph
            self._fixed_batch_size = n
        logger.info("captured %d draft graphs", len(self.graphs))

    def replay(self, bs: int, hidden_states: torch.Tensor, pages_per_seq: np.ndarray, last_page_len: np.ndarray):
        n = bs * self.topk
        self.hidden_states[:n].copy_(hidden_states)
        wrapper = self.draft_backend.decode_wrapper
        if wrapper._fixed_batch_size != n:  # expect: FC103
            logger.debug("re-planning draft decode for %d sequences", n)
        self.draft_backend.plan_step(n, pages_per_seq, last_page_len)
        self.graphs[bs].replay()
        return self.draft_out[:n]

    def run_eager(self, bs: int, hidden_states: torch.Tensor, pages_per_seq: np.ndarray, last_page_len: np.ndarray):
        n = bs * self.topk
        self.hidden_states[:n].copy_(hidden_states)
        self.draft_backend.plan_step(n, pages_per_seq, last_page_len)
        return self._run_steps(bs)
