"""Sampling strategies, swapped per step like the attention ones."""

from __future__ import annotations

import logging

import torch

from sso.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


class SamplerStrategy:
    def __init__(self, eos_token_id: int) -> None:
        self.eos_id = eos_token_id
        self.step = 0

    def sample(self, logits: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError

    def finished(self, next_tokens: torch.Tensor, batch: ForwardBatch) -> list[str]:
        return []


class GreedySampler(SamplerStrategy):
    def sample(self, logits, batch):
        if batch.min_tokens_mask is not None:
            logits[batch.min_tokens_mask, self.eos_id] = float("-inf")  # ok: FC101
        next_tokens = logits.argmax(dim=-1)
        self.step += 1
        logger.debug("step %d greedy tokens %s", self.step, next_tokens)  # ok: FC101
        return next_tokens

    def finished(self, next_tokens, batch):
        return [rid for i, rid in enumerate(batch.req_ids) if next_tokens[i] == self.eos_id]  # expect: FC101


class TemperatureSampler(SamplerStrategy):
    def sample(self, logits, batch):
        temps = batch.temperatures
        scaled = logits / torch.where(temps > 0, temps, torch.ones_like(temps)).unsqueeze(-1)  # ok: FC101
        probs = torch.softmax(scaled, dim=-1)
        next_tokens = torch.multinomial(probs, 1).squeeze(-1)
        self.step += 1
        logger.info(f"step {self.step} sampled {next_tokens}")  # expect: FC101
        return next_tokens


class NullSampler(SamplerStrategy):
    """Idle steps produce no tokens."""

    def sample(self, logits, batch):
        return torch.empty(0, dtype=torch.int64, device=logits.device)
