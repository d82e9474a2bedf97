from __future__ import annotations

from typing import List

import torch

from reasoning.hook import SamplerHook


class Sampler:
    def __init__(self, hooks: List[SamplerHook]):
        self.hooks = hooks

    def sample(self, logits: torch.Tensor, bs: int) -> torch.Tensor:
        sampled = torch.argmax(logits[:bs], dim=-1)
        for hook in self.hooks:
            sampled = hook(logits, sampled, bs)
        return sampled
