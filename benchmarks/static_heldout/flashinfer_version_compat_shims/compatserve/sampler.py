"""Top-k / top-p sampling: FlashInfer's fused sampler where the release has it."""

from __future__ import annotations

import torch
from torch import nn

from compatserve import compat
from compatserve.forward_batch import SamplingInfo


class Sampler(nn.Module):
    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, logits: torch.Tensor, info: SamplingInfo) -> torch.Tensor:
        logits = logits.float().div_(info.temperatures)
        if compat.top_k_top_p_sampling_from_logits is not None:
            # >= 0.2: one fused, rejection-based kernel, no host round trip
            return compat.top_k_top_p_sampling_from_logits(
                logits, info.top_ks, info.top_ps, filter_apply_order="joint"
            ).long()

        # 0.1.6 fallback in plain torch
        probs = torch.softmax(logits, dim=-1)
        if (info.top_ks < self.vocab_size).any():  # expect: FC101
            probs = _top_k_renorm(probs, info.top_ks)
        if info.need_top_p:  # ok: FC101
            probs = _top_p_renorm(probs, info.top_ps)
        return torch.multinomial(probs, num_samples=1).squeeze(1)


def _top_k_renorm(probs: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(probs.shape[-1], device=probs.device)
    sorted_probs.masked_fill_(ranks[None, :] >= top_ks[:, None], 0.0)
    out = torch.empty_like(probs).scatter_(-1, order, sorted_probs)
    return out / out.sum(dim=-1, keepdim=True)


def _top_p_renorm(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cum = sorted_probs.cumsum(dim=-1)
    sorted_probs.masked_fill_(cum - sorted_probs > top_ps[:, None], 0.0)
    out = torch.empty_like(probs).scatter_(-1, order, sorted_probs)
    return out / out.sum(dim=-1, keepdim=True)
