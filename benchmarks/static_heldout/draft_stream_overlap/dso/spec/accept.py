"""Greedy acceptance of the draft tokens against the target's argmax."""
from typing import Tuple

import torch


def greedy_accept(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """draft_tokens [bs, k], target_tokens [bs, k + 1] -> accepted lengths, flat accepted ids, bonus, padded."""
    match = draft_tokens == target_tokens[:, :-1]
    prefix_ok = match.int().cumprod(dim=1).bool()
    keep = match & prefix_ok
    accept_lens = keep.sum(dim=1)
    bonus = target_tokens.gather(1, accept_lens[:, None]).squeeze(1)
    accepted = draft_tokens[keep]  # expect: FC101
    padded = torch.where(keep, draft_tokens, torch.full_like(draft_tokens, -1))  # ok: FC101
    return accept_lens, accepted, bonus, padded
