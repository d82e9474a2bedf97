"""Temperature / top-k sampling over the last-token logits of each request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

_SAMPLING_EPS = 1e-5


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor
    top_k: Optional[torch.Tensor]
    all_greedy: bool
    all_random: bool

    @classmethod
    def from_requests(cls, temperatures: list[float], top_ks: list[int], device: torch.device) -> "SamplingMetadata":
        temperature = torch.tensor(temperatures, dtype=torch.float32, device=device)
        top_k = None
        if any(k > 0 for k in top_ks):
            vocab_cap = 1 << 30
            top_k = torch.tensor([k if k > 0 else vocab_cap for k in top_ks], dtype=torch.int32, device=device)
        return cls(
            temperature=temperature,
            top_k=top_k,
            all_greedy=all(t < _SAMPLING_EPS for t in temperatures),
            all_random=all(t >= _SAMPLING_EPS for t in temperatures),
        )


class Sampler(nn.Module):
    def forward(self, logits: torch.Tensor, sampling_metadata: SamplingMetadata) -> torch.Tensor:
        logits = logits.to(torch.float32)
        greedy = logits.argmax(dim=-1)
        if sampling_metadata.all_greedy:  # ok: FC101
            return greedy
        logits = logits / sampling_metadata.temperature.clamp(min=_SAMPLING_EPS).unsqueeze(1)
        if sampling_metadata.top_k is not None:
            logits = self._apply_top_k(logits, sampling_metadata.top_k)
        probs = logits.softmax(dim=-1)
        # Gumbel-style race: argmax(p / q) with q ~ Exp(1) samples from p without a sync.
        q = torch.empty_like(probs).exponential_()
        sampled = probs.div_(q).argmax(dim=-1)
        if not sampling_metadata.all_random:
            sampled = torch.where(sampling_metadata.temperature < _SAMPLING_EPS, greedy, sampled)
        return sampled

    @staticmethod
    def _apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
        # One topk over the largest k of the batch, then a per-row threshold.
        max_k = int(top_k.max())  # expect: FC101
        top_values = logits.topk(min(max_k, logits.shape[-1]), dim=-1).values
        kth_index = (top_k.long().clamp(max=top_values.shape[-1]) - 1).unsqueeze(1)
        kth = top_values.gather(1, kth_index)
        return logits.masked_fill(logits < kth, float("-inf"))
