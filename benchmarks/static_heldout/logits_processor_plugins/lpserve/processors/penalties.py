"""Repetition penalty over a window of recent tokens, applied inside the decode graph."""
from __future__ import annotations

from typing import Dict

import torch

from lpserve.processors.base import GraphLogitsProcessor
from lpserve.registry import register_processor


@register_processor("repetition")
class RepetitionPenalty(GraphLogitsProcessor):
    def __init__(self, cfg, device, attn, penalty: float = 1.1):
        assert penalty >= 1.0, "a repetition penalty below 1 rewards repeats"  # expect: FC109
        super().__init__(cfg, device, attn)
        self.default_penalty = penalty
        self.window = cfg.repetition_window
        # read by the graph: one factor per bucket row
        self.penalty = torch.full((self.max_rows,), penalty, dtype=torch.float32, device=device)
        self.recent_tokens = torch.zeros(cfg.max_batch_size, self.window, dtype=torch.long, device=device)
        self.window_lens = torch.zeros(cfg.max_batch_size, dtype=torch.int32, device=device)
        self.row_penalty: Dict[int, float] = {}

    def add_request(self, rid, req):
        self.row_penalty[rid] = req.repetition_penalty or self.default_penalty

    def release(self, rid):
        self.row_penalty.pop(rid, None)

    def prepare_step(self, batch):
        n = batch.num_rows
        if n > self.penalty.shape[0]:
            # eager batches past the largest bucket: grow the per-row factors
            self.penalty = self.penalty.new_full((n,), self.default_penalty)  # expect: FC107
        factors = torch.tensor(
            [self.row_penalty.get(rid, self.default_penalty) for rid in batch.rids], dtype=torch.float32
        )
        self.penalty[:n].copy_(factors, non_blocking=True)
        # slide the window by one and append the token the previous step sampled
        self.recent_tokens[:n, :-1].copy_(self.recent_tokens[:n, 1:].clone())
        self.recent_tokens[:n, -1].copy_(batch.last_tokens[:n])
        self.window_lens[:n].clamp_(max=self.window - 1).add_(1)

    def apply_graph(self, logits, bs):
        window = int(self.window_lens[:bs].max())  # expect: FC101
        recent = self.recent_tokens[:bs, self.window - window :]
        seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, recent, True)
        pen = self.penalty[:bs].unsqueeze(1)
        scaled = torch.where(logits > 0, logits / pen, logits * pen)
        return torch.where(seen, scaled, logits)
