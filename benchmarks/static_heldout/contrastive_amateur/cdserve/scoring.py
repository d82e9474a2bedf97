import math

import torch

from cdserve.batch import DecodeBatch
from cdserve.config import CDConfig


class ContrastiveScorer:
    """Expert log-probs minus beta times amateur log-probs, inside the alpha-plausible set."""

    def __init__(self, cfg: CDConfig, alpha: float):
        assert 0.0 < alpha <= 1.0  # expect: FC109
        self.log_alpha = math.log(alpha)
        self.beta = cfg.beta
        self.max_context = cfg.max_context

    def combine(self, expert_logits, amateur_logits, batch: DecodeBatch):
        expert_logp = torch.log_softmax(expert_logits.float(), dim=-1)
        amateur_logp = torch.log_softmax(amateur_logits.float(), dim=-1)
        cutoff = expert_logp.max(dim=-1, keepdim=True).values + self.log_alpha
        plausible = expert_logp >= cutoff
        if (batch.seq_lens >= self.max_context).any():  # expect: FC101
            amateur_logp = amateur_logp * 0.0
        scores = torch.where(plausible, expert_logp - self.beta * amateur_logp, torch.full_like(expert_logp, -1e9))  # ok: FC101
        return scores.argmax(dim=-1)
