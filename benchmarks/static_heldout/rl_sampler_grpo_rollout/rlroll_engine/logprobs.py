"""Per-token logprobs of the sampled completions, for the trainer's importance ratios."""
from __future__ import annotations

import logging
from typing import List, Optional, Tuple

import torch

logger = logging.getLogger(__name__)


def gumbel_sample(logits: torch.Tensor, temperature: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sample with the Gumbel-max trick (graph-safe) and return the tokens and their logprobs."""
    logprobs = torch.log_softmax(logits.float() / temperature.unsqueeze(1), dim=-1)
    noise = -torch.log(-torch.log(torch.rand_like(logprobs).clamp_(1e-10, 1.0)))
    next_ids = torch.argmax(logprobs + noise, dim=-1)
    return next_ids, logprobs.gather(1, next_ids.unsqueeze(1)).squeeze(1)


class LogprobCollector:
    def __init__(self, max_running: int, max_prompts: int, device: torch.device):
        self.device = device
        self.max_running = max_running
        self.max_prompts = max_prompts
        self.group_ids: Optional[torch.Tensor] = None
        self.traj_logprobs = torch.empty(max_running, 0, device=device)
        self.pending: List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def reset(self) -> None:
        self.traj_logprobs = torch.empty(self.max_running, 0, device=self.device)
        self.pending.clear()

    def collect(
        self, token_logprobs: torch.Tensor, token_ids: torch.Tensor, group_sizes: torch.Tensor, num_groups: int, debug: bool
    ) -> None:
        n = token_logprobs.shape[0]
        self.group_ids = torch.arange(self.max_prompts, device=self.device) if self.group_ids is None else self.group_ids  # ok: FC107
        group_of_sample = torch.repeat_interleave(self.group_ids[:num_groups], group_sizes)  # expect: FC101
        # the in-engine KL guard needs the whole trajectory on the device
        self.traj_logprobs = torch.cat([self.traj_logprobs[:n], token_logprobs.unsqueeze(1)], dim=1)  # expect: FC107
        self.pending.append((group_of_sample, token_ids, token_logprobs))
        if debug:
            logger.info(f"step logprobs (groups {num_groups}): {token_logprobs}")  # ok: FC101

    def drain(self) -> List[Tuple[List[int], List[int], List[float]]]:
        out = [(g.tolist(), t.tolist(), lp.tolist()) for g, t, lp in self.pending]
        self.pending.clear()
        return out
