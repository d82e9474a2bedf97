from __future__ import annotations

import collections
import logging

import torch

from tforge.config import RunnerConfig
from tforge.model_executor.forward_batch import SamplingInfo
from tforge.utils.memory import alloc_buffer

logger = logging.getLogger(__name__)


class Sampler:
    """Top-p sampling, or chain rejection sampling of draft tokens when speculative
    decoding is on (the verify graph records this sampler too)."""

    def __init__(self, cfg: RunnerConfig, device: torch.device):
        self.spec = cfg.speculative_num_draft_tokens > 0
        self.num_draft = cfg.speculative_num_draft_tokens
        self.vocab_size = cfg.vocab_size
        # uniform draws for the accept test, filled in place each step
        self.uniform = alloc_buffer(cfg.max_batch_size * max(1, self.num_draft) * 4, device,
                                    dtype=torch.float32)
        self.accept_hist: collections.Counter[int] = collections.Counter()

    def forward(self, logits: torch.Tensor, info: SamplingInfo, *, log_stats: bool) -> torch.Tensor:
        temps = info.temperatures.repeat_interleave(self.num_draft + 1) if self.spec else info.temperatures
        probs = torch.softmax(logits / temps[:, None], dim=-1)
        if not self.spec:
            return torch.multinomial(probs, 1).squeeze(-1)
        bs = info.draft_token_ids.shape[0]
        k = self.num_draft
        target = probs.view(bs, k + 1, -1)
        draft = info.draft_token_ids
        p_t = target[:, :k].gather(-1, draft[..., None]).squeeze(-1)
        p_d = info.draft_probs.gather(-1, draft[..., None]).squeeze(-1)
        u = self.uniform[: bs * k].view(bs, k).uniform_()
        accepted = (u * p_d <= p_t).to(torch.int32).cumprod(dim=1)
        num_accepted = accepted.sum(dim=1)
        # trim the verified block to the longest accepted run in the batch
        max_accepted = num_accepted.max().item()  # expect: FC101
        bonus = torch.multinomial(target[torch.arange(bs, device=logits.device), num_accepted], 1)
        out = torch.where(accepted.bool(), draft, -1)
        out = torch.cat([out, bonus], dim=1)[:, : max_accepted + 1]
        if log_stats:
            self._record_acceptance(num_accepted)
        return out

    def _record_acceptance(self, num_accepted: torch.Tensor) -> None:
        self.accept_hist.update(num_accepted.tolist())  # ok: FC101
