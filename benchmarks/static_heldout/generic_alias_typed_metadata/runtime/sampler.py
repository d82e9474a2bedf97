"""Token sampler: greedy rows and top-k / top-p rows in one batch."""

from __future__ import annotations

from typing import Optional

import torch
from flashinfer.sampling import top_k_top_p_sampling_from_probs
from torch import nn

from tmeta.batch import SamplingInfo


class Sampler(nn.Module):
    def __init__(self, vocab_size: int, max_bs: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.max_bs = max_bs
        self._top_k_fill: Optional[torch.Tensor] = None

    def forward(self, logits: torch.Tensor, info: Optional[SamplingInfo]) -> torch.Tensor:
        if info is None or info.all_greedy:
            return torch.argmax(logits, dim=-1)
        n = logits.shape[0]
        if self._top_k_fill is None:
            self._top_k_fill = torch.full(  # ok: FC107
                (self.max_bs,), self.vocab_size, dtype=torch.int32, device=logits.device
            )
        greedy = info.temperatures <= 0.0
        temps = torch.where(greedy, torch.ones_like(info.temperatures), info.temperatures)
        probs = torch.softmax(logits.float() / temps.unsqueeze(-1), dim=-1)
        top_ks = torch.where(info.top_ks > 0, info.top_ks, self._top_k_fill[:n])
        sampled = top_k_top_p_sampling_from_probs(probs, top_ks, info.top_ps)
        if greedy.any():  # expect: FC101
            sampled = torch.where(greedy, torch.argmax(logits, dim=-1), sampled)
        return sampled
