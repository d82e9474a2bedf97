"""Sampling: greedy / temperature with top-k through Gumbel-max, min-new-tokens EOS suppression."""
from __future__ import annotations

import torch

from ..batch import ForwardBatch
from ..config import EngineConfig


class Sampler:
    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.device = device
        self.max_bs = cfg.max_batch_size
        self.max_top_k = cfg.max_top_k
        self._noise = None

    def sample(self, logits: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        greedy = torch.argmax(logits, dim=-1)
        if (fb.temperatures == 0).all():  # expect: FC101
            return greedy
        logits = logits.float() / fb.temperatures.clamp(min=1e-5).unsqueeze(-1)
        max_top_k = min(int(fb.top_k_cpu.max()), self.max_top_k)  # ok: FC101
        vals, idx = logits.topk(max(max_top_k, 1), dim=-1)
        ranks = torch.arange(vals.shape[-1], device=logits.device)
        vals = vals.masked_fill(ranks.unsqueeze(0) >= fb.top_k.unsqueeze(-1), float("-inf"))
        probs = torch.softmax(vals, dim=-1)
        if self._noise is None:
            self._noise = torch.empty(self.max_bs, self.max_top_k, device=self.device)  # ok: FC107
        noise = self._noise[: probs.shape[0], : probs.shape[1]].exponential_()
        choice = (probs / noise).argmax(dim=-1, keepdim=True)
        sampled = idx.gather(-1, choice).squeeze(-1)
        return torch.where(fb.temperatures == 0, greedy, sampled)


def suppress_eos(logits: torch.Tensor, fb: ForwardBatch, eos_token_id: int) -> None:
    """Requests below their min_new_tokens may not stop: mask EOS and the stop ids in place."""
    under = (fb.output_lens < fb.min_new_tokens).unsqueeze(-1)
    if eos_token_id in fb.stop_token_ids:  # expect: FC101
        cols = fb.stop_token_ids
    else:
        cols = torch.cat([fb.stop_token_ids, fb.stop_token_ids.new_full((1,), eos_token_id)])
    logits[:, cols] = logits[:, cols].masked_fill(under, float("-inf"))
