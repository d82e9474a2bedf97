"""Token sampler, resolved from the platform table (``"qrserve.sampler.Sampler"``) and built by the runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
from torch import nn

from qrserve.config import EngineConfig

_SAMPLING_EPS = 1e-5


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor  # [num_reqs], device
    all_greedy: bool  # from the host mirror of the temperatures
    min_tokens: torch.Tensor  # [num_reqs], device
    output_lens: torch.Tensor  # [num_reqs], device
    num_logprobs: torch.Tensor  # [num_reqs], device; 0 = none requested
    max_num_logprobs: int


class LogprobsTensors(NamedTuple):
    topk_ids: torch.Tensor
    topk_logprobs: torch.Tensor
    sampled_logprobs: torch.Tensor


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor
    logprobs: Optional[LogprobsTensors]


class Sampler(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.eos_token_id = cfg.eos_token_id

    def forward(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        # min_tokens: requests that may not stop yet cannot sample EOS
        too_short = md.output_lens < md.min_tokens
        logits[too_short, self.eos_token_id] = float("-inf")  # ok: FC101

        greedy = logits.argmax(dim=-1)
        if md.all_greedy:  # ok: FC101
            sampled = greedy
        else:
            sampled = self._sample(logits, greedy, md)

        logprobs = None
        if md.max_num_logprobs > 0:
            logprobs = self._gather_logprobs(logits, sampled, md)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    def _sample(self, logits: torch.Tensor, greedy: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        is_greedy = md.temperature < _SAMPLING_EPS
        if is_greedy.all():  # expect: FC101
            return greedy
        temperature = torch.where(is_greedy, 1.0, md.temperature)  # ok: FC101
        probs = torch.softmax(logits / temperature.unsqueeze(1), dim=-1, dtype=torch.float32)
        # Gumbel-max through exponential noise: argmax(p / q), q ~ Exp(1)
        noise = torch.empty_like(probs).exponential_()
        random = probs.div_(noise).argmax(dim=-1)
        return torch.where(is_greedy, greedy, random)

    def _gather_logprobs(self, logits: torch.Tensor, sampled: torch.Tensor, md: SamplingMetadata) -> LogprobsTensors:
        logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        wants = md.num_logprobs > 0
        rows = logprobs[wants]  # expect: FC101
        top = rows.topk(md.max_num_logprobs, dim=-1)
        sampled_lp = logprobs.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
        return LogprobsTensors(top.indices, top.values, sampled_lp)
