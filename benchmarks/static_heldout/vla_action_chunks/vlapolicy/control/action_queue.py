"""ACT-style temporal ensembling of overlapping action chunks, on the device."""
from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl


@triton.jit
def decay_weights_kernel(w_ptr, age_ptr, n, decay, BLOCK: tl.constexpr):
    assert BLOCK % 32 == 0  # ok: FC109
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    age = tl.load(age_ptr + offs, mask=m, other=0)
    tl.store(w_ptr + offs, tl.exp(-decay * age.to(tl.float32)), mask=m)


class ActionChunkQueue:
    """Keeps the last `horizon` chunks of every robot; the action executed at tick t blends
    every stored chunk's prediction for t with weights exp(-decay * age)."""

    def __init__(self, horizon: int, num_robots: int, action_dim: int, decay: float, device: torch.device):
        assert 0.0 < decay <= 1.0  # expect: FC109
        self.horizon = horizon
        self.num_robots = num_robots
        self.decay = decay
        self.device = device
        self.chunks = torch.zeros(horizon, num_robots, horizon, action_dim, device=self.device)
        self.age = torch.full((horizon,), horizon, dtype=torch.int32, device=self.device)
        self.weights = torch.zeros(horizon, dtype=torch.float32, device=self.device)
        self.gate = torch.ones(num_robots, dtype=torch.bool, device=self.device)
        self.slots = torch.arange(horizon, device=self.device)
        self.head = 0

    def push(self, actions: torch.Tensor) -> None:
        h = actions.shape[1]
        self.chunks[self.head].zero_()
        self.chunks[self.head, :, :h].copy_(actions)
        self.age += 1
        self.age[self.head] = 0
        self.head = (self.head + 1) % self.horizon

    def ensemble(self, actions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        self.push(actions)
        decay_weights_kernel[(1,)](self.weights, self.age, self.horizon, self.decay, BLOCK=32)
        # each stored chunk's prediction for the current tick: [horizon, robots, action_dim]
        pred = self.chunks[self.slots, :, self.age.clamp(max=self.horizon - 1)]
        stale = self.age >= self.horizon
        rows = torch.cat([pred.flatten(1), self.weights[:, None]], dim=1)[~stale]  # expect: FC101
        w = rows[:, -1]
        pred = rows[:, :-1].view(-1, self.num_robots, pred.shape[-1])
        blended = (w[:, None, None] * pred).sum(0) / w.sum().clamp_min(1e-6)
        return blended, self.gate

    def reset_robot(self, slot: int) -> None:
        self.chunks[:, slot].zero_()
