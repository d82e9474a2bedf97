"""Difficulty scoring: a request escalates when the small model's next-token entropy is high."""

from __future__ import annotations

from typing import List

import torch

from cascade.requests import Request


@torch.jit.script
def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    assert logits.dim() == 2  # ok: FC109
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


class DifficultyScorer:
    def __init__(self, max_bs: int, threshold: float, device: torch.device):
        self.max_bs = max_bs
        self.threshold = threshold
        self.entropy_buf = torch.zeros(max_bs, dtype=torch.float32, device=device)

    def score(self, reqs: List[Request], logits: torch.Tensor) -> List[Request]:
        n = len(reqs)
        if n > self.max_bs:
            raise ValueError(f"scoring {n} rows > {self.max_bs}; last entropies {self.entropy_buf}")  # ok: FC101
        ent = self.entropy_buf[:n]
        ent.copy_(token_entropy(logits[:n]))
        return [r for i, r in enumerate(reqs) if ent[i] > self.threshold]  # expect: FC101
