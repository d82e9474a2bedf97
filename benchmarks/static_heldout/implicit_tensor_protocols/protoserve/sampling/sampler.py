"""Token sampler: penalties, min-token stop blocking, top-k / top-p and logprobs."""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from protoserve.config import EngineConfig
from protoserve.forward_batch import SamplingBatchInfo
from protoserve.sampling.penalties import Penalizer


@dataclass
class SamplerOutput:
    next_token_ids: torch.Tensor
    logprobs: torch.Tensor
    topk_ids: Optional[torch.Tensor] = None
    topk_logprobs: Optional[torch.Tensor] = None


class Sampler(nn.Module):
    def __init__(self, cfg: EngineConfig, device: torch.device):
        super().__init__()
        self.vocab_size = cfg.vocab_size
        self.num_top_logprobs = cfg.max_top_logprobs
        self.min_tokens_enabled = True
        self.penalizer = Penalizer(cfg.max_num_reqs, cfg.vocab_size, cfg.penalty_history, device)

    def forward(self, logits: torch.Tensor, info: SamplingBatchInfo) -> SamplerOutput:
        logits = logits.float()
        if info.has_penalties:  # ok: FC101
            self.penalizer.apply_penalties(logits, info)
        if info.no_repeat_ngram_sizes_cpu.any():
            self.penalizer.apply_no_repeat_ngram(logits, info)
        if (info.min_new_tokens > info.output_lens).any() and self.min_tokens_enabled:  # expect: FC101
            self.penalizer.block_stop_tokens(logits, info)

        logprobs = torch.log_softmax(logits, dim=-1)
        if info.all_greedy:
            next_ids = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(logits / info.temperatures, dim=-1)
            next_ids = self._sample(probs, info)

        token_logprobs = logprobs.gather(-1, next_ids[:, None]).squeeze(-1)
        topk_ids = topk_logprobs = None
        if info.return_top_logprobs:
            top = logprobs.topk(self.num_top_logprobs, dim=-1)
            topk_ids, topk_logprobs = top.indices, top.values
        self.penalizer.record(info, next_ids)
        return SamplerOutput(next_ids, token_logprobs, topk_ids, topk_logprobs)

    def _sample(self, probs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        if (info.top_ks_cpu < self.vocab_size).any():  # ok: FC101
            k_max = int(info.top_ks_cpu.max())
            kth = probs.topk(k_max, dim=-1).values.gather(-1, (info.top_ks - 1).clamp(max=k_max - 1)[:, None])
            probs = probs.masked_fill(probs < kth, 0.0)
        # Top-p by rejection: redraw the rows whose sample falls outside the nucleus.
        samples = torch.multinomial(probs, 1).squeeze(-1)
        accepted = self._in_nucleus(probs, samples, info.top_ps)
        while not accepted.all():  # expect: FC101
            retry = torch.multinomial(probs, 1).squeeze(-1)
            samples = torch.where(accepted, samples, retry)
            accepted = self._in_nucleus(probs, samples, info.top_ps)
        return samples

    @staticmethod
    def _in_nucleus(probs: torch.Tensor, samples: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
        p = probs.gather(-1, samples[:, None])
        mass_above = (probs * (probs > p)).sum(-1)
        return mass_above < top_ps
