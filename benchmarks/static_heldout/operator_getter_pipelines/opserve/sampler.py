"""Sampling, as a tuple of stages run over the step context."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from opserve.batch import temps_of
from opserve.config import EngineConfig

if TYPE_CHECKING:
    from opserve.stages import StepContext


class Sampler:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.device = device
        self.max_bs = cfg.max_batch_size
        self.vocab_size = cfg.vocab_size
        self.eos_token_id = cfg.eos_token_id
        self.frequency_penalty = cfg.frequency_penalty
        self.greedy_eps = 1e-5
        # [req_pool slot, vocab] counts of generated tokens, for the frequency penalty.
        self.token_counts: Optional[torch.Tensor] = None

    def sample(self, ctx: "StepContext") -> None:
        for stage in SAMPLE_STAGES:
            stage(self, ctx)

    def apply_penalties(self, ctx: "StepContext") -> None:
        if self.token_counts is None:
            self.token_counts = torch.zeros(self.max_bs, self.vocab_size, dtype=torch.int32, device=self.device)  # ok: FC107
        if self.frequency_penalty:
            counts = self.token_counts[ctx.batch.req_pool_indices]
            ctx.logits = ctx.logits - self.frequency_penalty * counts.to(ctx.logits.dtype)

    def apply_temperature(self, ctx: "StepContext") -> None:
        temps = temps_of(ctx.batch).clamp(min=self.greedy_eps)
        ctx.logits = ctx.logits / temps.unsqueeze(1).to(ctx.logits.dtype)

    def pick(self, ctx: "StepContext") -> None:
        bs = ctx.batch.batch_size
        ctx.next_ids = torch.empty(bs, dtype=torch.int64, device=ctx.logits.device)  # ok: FC107
        torch.argmax(ctx.logits, dim=-1, out=ctx.next_ids)
        sampled = torch.multinomial(torch.softmax(ctx.logits.float(), dim=-1), 1).squeeze(1)
        greedy = temps_of(ctx.batch) <= self.greedy_eps
        ctx.next_ids = torch.where(greedy, ctx.next_ids, sampled)  # ok: FC101

    def count_tokens(self, ctx: "StepContext") -> None:
        ones = torch.ones_like(ctx.next_ids, dtype=torch.int32)
        self.token_counts.index_put_((ctx.batch.req_pool_indices, ctx.next_ids), ones, accumulate=True)

    def mark_finished(self, ctx: "StepContext") -> None:
        ctx.finished_rows = (ctx.next_ids == self.eos_token_id).nonzero().squeeze(1)  # expect: FC101
        self.token_counts[ctx.batch.req_pool_indices[ctx.finished_rows]] = 0


SAMPLE_STAGES = (
    lambda s, ctx: s.apply_penalties(ctx),
    lambda s, ctx: s.apply_temperature(ctx),
    lambda s, ctx: s.pick(ctx),
    lambda s, ctx: s.count_tokens(ctx),
    lambda s, ctx: s.mark_finished(ctx),
)
