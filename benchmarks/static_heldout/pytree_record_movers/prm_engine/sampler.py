"""Sampler over a SamplingRecord; returns a SampleResult record."""

from __future__ import annotations

import logging
from typing import Optional

import torch
from torch.utils._pytree import tree_flatten

from prm_engine.records import ForwardBatch, SampleResult

logger = logging.getLogger(__name__)


class Sampler:
    def __init__(self, cfg):
        self.device = torch.device(cfg.device)
        self.eos_id = cfg.eos_token_id
        self.token_buf = torch.zeros(cfg.max_bs, dtype=torch.int64, device=self.device)
        self.gumbel: Optional[torch.Tensor] = None

    def sample(self, logits: torch.Tensor, fb: ForwardBatch) -> SampleResult:
        s = fb.sampling
        n = logits.shape[0]
        leaves, _ = tree_flatten({"t": s.temperatures, "p": s.top_ps})
        for leaf in leaves:
            if torch.isnan(leaf).any():  # expect: FC101
                raise ValueError("NaN in sampling parameters")
        logger.debug("sampling temperatures %s", s.temperatures)  # ok: FC101
        if self.token_buf.numel() < n:
            self.token_buf = torch.empty(n, dtype=torch.int64, device=self.device)  # expect: FC107
        if self.gumbel is None:
            self.gumbel = torch.empty(logits.shape, device=self.device)  # ok: FC107
        done = s.min_tokens_left > 0
        logits[done, self.eos_id] = float("-inf")  # ok: FC101
        greedy = s.temperatures == 0
        logits = logits / torch.where(greedy, torch.ones_like(s.temperatures), s.temperatures).unsqueeze(1)
        probs = torch.softmax(logits, dim=-1)
        greedy_probs = probs[greedy]  # expect: FC101
        probs = self._top_p(probs, s.top_ps)
        sampled = torch.multinomial(probs, 1).squeeze(1)
        sampled = torch.where(greedy, probs.argmax(-1), sampled)
        self.greedy_conf = greedy_probs.amax(-1)
        self.token_buf[:n].copy_(sampled)
        logprobs = torch.log(probs.gather(1, sampled.unsqueeze(1))).squeeze(1) if fb.return_logprob else None
        return SampleResult(next_token_ids=self.token_buf[:n], logprobs=logprobs)

    @staticmethod
    def _top_p(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        sorted_p = sorted_p.masked_fill(cum - sorted_p > top_ps.unsqueeze(1), 0.0)
        return torch.zeros_like(probs).scatter_(1, idx, sorted_p)

    def expand_per_token(self, values: torch.Tensor, counts: torch.Tensor, total_tokens: int) -> torch.Tensor:
        return torch.repeat_interleave(values, counts, output_size=total_tokens)  # ok: FC101
