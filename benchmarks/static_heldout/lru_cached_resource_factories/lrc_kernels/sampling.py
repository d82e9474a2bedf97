"""Device-side sampling: greedy and top-p, with FlashInfer's sampling kernels."""
from __future__ import annotations

import functools
from typing import Optional

import torch
from flashinfer.sampling import top_p_sampling_from_probs


@torch.jit.script
def scale_logits(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    assert logits.dim() == 2, "logits must be [rows, vocab]"  # ok: FC109
    return logits / temperatures.clamp_min(1e-5).unsqueeze(1)


class Sampler:
    def __init__(self, vocab_size: int, eos_token_id: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.eos_id = eos_token_id
        self.device = device

    def _sample(
        self,
        logits: torch.Tensor,
        temperatures: torch.Tensor,
        top_p: torch.Tensor,
        too_short: Optional[torch.Tensor] = None,
        *,
        greedy: bool,
    ) -> torch.Tensor:
        if too_short is not None:
            # rows below their min_tokens may not stop yet
            logits[too_short, self.eos_id] = float("-inf")  # ok: FC101
        if greedy:
            return torch.argmax(logits, dim=-1)
        if (temperatures <= 0).any():  # expect: FC101
            # some rows asked for greedy decoding: sample the rest, then patch those rows
            sampled = top_p_sampling_from_probs(torch.softmax(scale_logits(logits, temperatures), dim=-1), top_p)
            return torch.where(temperatures <= 0, torch.argmax(logits, dim=-1), sampled)
        probs = torch.softmax(scale_logits(logits, temperatures), dim=-1)
        return top_p_sampling_from_probs(probs, top_p)

    sample_greedy = functools.partialmethod(_sample, greedy=True)
    sample_random = functools.partialmethod(_sample, greedy=False)
