"""Sampling for the one live sequence."""
from __future__ import annotations

import logging
from typing import Optional

import torch
from flashcheck import hot_path
from flashinfer.sampling import top_k_top_p_sampling_from_probs

logger = logging.getLogger(__name__)


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, top_k: int = 40, top_p: float = 0.95, temperature: float = 0.7, repetition_penalty: float = 1.1):
        self.vocab_size = vocab_size
        self.device = device
        self.top_k = top_k
        self.top_p = top_p
        self.temperature = temperature
        self.repetition_penalty = repetition_penalty
        self.is_greedy = temperature == 0.0
        self._backend = "flashinfer"  # ok: FC103
        self.seen: Optional[torch.Tensor] = None
        self.penalty_mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        self.next_id = torch.zeros(1, dtype=torch.int64, device=device)

    def observe(self, token_ids: torch.Tensor) -> None:
        if self.seen is None:
            self.seen = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)  # ok: FC107
        self.seen[token_ids] = True

    @hot_path
    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        logger.debug("sampling with %s over %s", self._backend, logits)  # ok: FC101
        logits = logits.float().view(-1)
        if self.is_greedy:  # ok: FC101
            torch.argmax(logits, out=self.next_id[0])
            return self.next_id
        self.penalty_mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)  # expect: FC107
        if self.seen is not None:
            self.penalty_mask.copy_(self.seen)
        logits = torch.where(self.penalty_mask, logits / self.repetition_penalty, logits)
        probs = torch.softmax(logits / self.temperature, dim=-1)
        if (probs.sum() - 1.0).abs() > 1e-3:  # expect: FC101
            probs = probs / probs.sum()
        ids = top_k_top_p_sampling_from_probs(probs.view(1, -1), self.top_k, self.top_p)
        self.next_id.copy_(ids)
        return self.next_id
