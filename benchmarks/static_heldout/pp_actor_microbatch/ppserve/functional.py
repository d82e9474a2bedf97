"""Small functional helpers: stage functions are closures over the wrappers they run."""
from __future__ import annotations

from typing import Callable, Iterable

import torch

StageFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def make_prefix_fn(wrapper, layers: Iterable[torch.nn.Module]) -> StageFn:
    layers = tuple(layers)

    def stage_fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        h = wrapper.run(q, k, v)  # expect: FC108
        for layer in layers:
            h = layer(h)
        return h

    return stage_fn


def compose(*fns: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    def run_all(x: torch.Tensor) -> torch.Tensor:
        for f in fns:
            x = f(x)
        return x

    return run_all
