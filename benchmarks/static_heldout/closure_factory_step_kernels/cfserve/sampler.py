"""Sampling closure: temperature sampling with a per-request greedy fallback."""

from __future__ import annotations

from typing import Callable

import torch

from .batch import ForwardBatch
from .config import EngineConfig


def make_sampler(cfg: EngineConfig, device: torch.device, seed: int = 0) -> Callable[[torch.Tensor, ForwardBatch], torch.Tensor]:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    vocab = cfg.vocab_size

    def sample(logits: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        assert logits.dim() == 2 and logits.shape[-1] == vocab, "sampler expects [batch, vocab] logits"  # expect: FC109
        if batch.all_greedy:  # ok: FC101
            return logits.argmax(dim=-1)
        temps = batch.temperatures
        if (temps <= 0).all():  # expect: FC101
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / temps.clamp_min(1e-5).unsqueeze(-1), dim=-1)
        sampled = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        return torch.where(temps > 0, sampled, logits.argmax(dim=-1))

    return sample
