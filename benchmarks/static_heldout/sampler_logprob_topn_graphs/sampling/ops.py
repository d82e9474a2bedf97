"""Device-side sampling ops; all of them run inside the captured sampler graphs."""

from __future__ import annotations

import torch


def apply_penalties(
    logits: torch.Tensor, counts: torch.Tensor, rep_pen: torch.Tensor, freq_pen: torch.Tensor
) -> torch.Tensor:
    freq = freq_pen.unsqueeze(1) * counts
    if not (rep_pen != 1.0).any():  # expect: FC101
        return logits - freq
    rp = rep_pen.unsqueeze(1)
    penalized = torch.where(logits > 0, logits / rp, logits * rp)
    return torch.where(counts > 0, penalized, logits) - freq


def min_p_filter(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    top = probs.max(dim=-1, keepdim=True).values
    return torch.where(probs < min_p.unsqueeze(1) * top, torch.full_like(logits, float("-inf")), logits)  # ok: FC101


def exponential_race(logprobs: torch.Tensor) -> torch.Tensor:
    """Sample by argmax(p / E) with E ~ Exp(1); no host round trip, graph-safe."""
    noise = torch.empty_like(logprobs).exponential_(1.0)
    return (logprobs.exp() / noise).argmax(dim=-1)


def topn_logprobs(logprobs: torch.Tensor, n_max: int):
    vals, ids = torch.topk(logprobs, n_max, dim=-1)
    return ids, vals
