"""Greedy verification of the draft tokens against the target's logits."""

from __future__ import annotations

import torch

from specroll.verify_types import VerifyOutput


def verify_and_sample(logits: torch.Tensor, draft_tokens: torch.Tensor, draft_lens: torch.Tensor,
                      k: int) -> VerifyOutput:
    bs = draft_tokens.shape[0]
    target = torch.argmax(logits.view(bs, k + 1, -1), dim=-1)          # [bs, k + 1]
    steps = torch.arange(k, device=logits.device)
    match = (target[:, :k] == draft_tokens) & (steps[None, :] < draft_lens[:, None])
    accept = match.to(torch.int32).cumprod(dim=1).sum(dim=1, dtype=torch.int32)
    nxt = target.gather(1, accept.long()[:, None]).squeeze(1)
    return VerifyOutput(accept_counts=accept, num_rejected=draft_lens - accept, next_tokens=nxt)
