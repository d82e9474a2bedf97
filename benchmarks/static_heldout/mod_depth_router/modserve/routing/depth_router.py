"""Shared depth router: one decision per token for every mixture-of-depths block.

Tokens the router keeps go through all routed blocks and write KV into the routed page pool; the
others skip those blocks (residual only). Prefill uses expert-choice top-k over the chunk; decode
uses the causal predictor, since top-k over a decode batch would leak between requests.
"""
from __future__ import annotations

import logging
from typing import List, Tuple

import numpy as np
import torch
from torch import nn

from modserve.config import MoDConfig

logger = logging.getLogger(__name__)


class DepthRouter(nn.Module):
    def __init__(self, cfg: MoDConfig, device: torch.device):
        super().__init__()
        assert 0.0 < cfg.capacity_ratio <= 1.0, "capacity ratio must be in (0, 1]"  # expect: FC109
        self.cfg = cfg
        self.device = device
        self.proj = nn.Linear(cfg.hidden_size, 1, bias=False, device=device)
        self.predictor = nn.Sequential(
            nn.Linear(cfg.hidden_size, 256, device=device),
            nn.SiLU(),
            nn.Linear(256, 1, device=device),
        )
        self.threshold = cfg.router_threshold
        # host table: capacity of every batch size, read while the chunk is scheduled
        self.capacity_np = np.array([cfg.capacity(n) for n in range(cfg.max_num_tokens + 1)], dtype=np.int64)
        self.route_mask = torch.zeros(cfg.max_batch, dtype=torch.bool, device=device)
        self.route_weight = None
        self.sel_rows = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=device)
        self._plan_info = None  # the router's own record of the last routed plan  # ok: FC103

    def topk_rows(self, hidden: torch.Tensor, num_tokens: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Expert-choice routing over a prefill chunk (non-causal, prefill only)."""
        cap = int(self.capacity_np[num_tokens])  # ok: FC101
        scores = self.proj(hidden[:num_tokens]).squeeze(-1)
        logger.debug("router scores %s", scores)  # ok: FC101
        top = scores.topk(cap, sorted=True)
        rows, _ = top.indices.sort()
        return rows, torch.sigmoid(top.values)

    def select_rows(self, hidden: torch.Tensor, num_tokens: int) -> List[int]:
        """Rows of the chunk that go through the routed blocks, as host ints for the page tables."""
        rows, _ = self.topk_rows(hidden, num_tokens)
        self.sel_rows[: rows.numel()].copy_(rows)
        return self.sel_rows[: rows.numel()].tolist()  # expect: FC101

    def predict_keep(self, hidden: torch.Tensor, num_rows: int) -> torch.Tensor:
        """Causal decode-time decision: one bool per row."""
        logits = self.predictor(hidden[:num_rows]).squeeze(-1)
        self.route_mask = torch.zeros(self.cfg.max_batch, dtype=torch.bool, device=self.device)  # expect: FC107
        keep = self.route_mask[:num_rows]
        torch.gt(logits, self.threshold, out=keep)
        if not keep.any():  # expect: FC101
            keep[torch.argmax(logits)] = True
        if self.route_weight is None:
            self.route_weight = torch.ones(self.cfg.max_batch, dtype=hidden.dtype, device=self.device)  # ok: FC107
        self.route_weight[:num_rows] = torch.where(keep, torch.sigmoid(logits), torch.zeros_like(logits))  # ok: FC101
        return keep
