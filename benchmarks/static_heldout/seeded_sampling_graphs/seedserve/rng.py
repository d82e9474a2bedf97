"""Counter-based RNG: a row's noise depends only on (seed, offset), never on the batch."""

from __future__ import annotations

import numpy as np
import torch

@torch.jit.script
def philox_uniform(seeds: torch.Tensor, offsets: torch.Tensor, vocab: int) -> torch.Tensor:
    assert vocab > 0  # ok: FC109
    col = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    x = seeds[:, None] * 0x9E3779B1 + offsets[:, None] * 0x85EBCA77 + col[None, :] * 0xC2B2AE3D
    x = x ^ ((x >> 15) & 0x1FFFFFFFFFFFF)
    x = x * 0x2C1B3C6D
    x = x ^ ((x >> 12) & 0xFFFFFFFFFFFFF)
    x = x * 0x297A2D39
    x = x ^ ((x >> 15) & 0x1FFFFFFFFFFFF)
    return ((x & 0xFFFFFF).to(torch.float32) + 0.5) / 16777216.0


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(u))


class SeedTable:
    """Per-slot (seed, philox offset, last token) on the device, one row of `state` each.

    The captured graphs gather their rows from here and write the advanced offsets
    back, so the storage must outlive every graph.  Slot 0 is the scratch slot padded
    rows of a bucket use.
    """

    def __init__(self, capacity: int, device: torch.device):
        self.device = device
        self.capacity = capacity
        self.state = torch.zeros(3, capacity, dtype=torch.int64, device=device)
        self.seeds_np = np.zeros(capacity, dtype=np.int64)
        self.offsets_np = np.zeros(capacity, dtype=np.int64)
        self.offsets_host = torch.zeros(capacity, dtype=torch.int64, pin_memory=True)
        # rows: slot, seed, offset
        self.seed_staging = torch.zeros(3, 64, dtype=torch.int64, pin_memory=True)

    @property
    def seeds(self) -> torch.Tensor:
        return self.state[0]

    @property
    def offsets(self) -> torch.Tensor:
        return self.state[1]

    @property
    def last_token(self) -> torch.Tensor:
        return self.state[2]

    def ensure_capacity(self, max_slot: int) -> None:
        if max_slot < self.capacity:
            return
        extra = max(self.capacity, max_slot + 1 - self.capacity)
        grown = torch.zeros(3, extra, dtype=torch.int64, device=self.device)
        self.state = torch.cat([self.state, grown], dim=1)  # expect: FC107
        self.seeds_np = np.concatenate([self.seeds_np, np.zeros(extra, dtype=np.int64)])
        self.offsets_np = np.concatenate([self.offsets_np, np.zeros(extra, dtype=np.int64)])
        self.capacity += extra

    def stage(self, slots_np: np.ndarray, seeds_np: np.ndarray, offsets_np: np.ndarray) -> None:
        """New or resumed requests: (slot, seed, offset) through pinned memory, one copy."""
        n = int(slots_np.shape[0])
        if n > self.seed_staging.shape[1]:
            self.seed_staging = torch.zeros(3, 2 * n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        view = self.seed_staging.numpy()  # ok: FC101
        view[0, :n] = slots_np
        view[1, :n] = seeds_np
        view[2, :n] = offsets_np
        self.seeds_np[slots_np] = seeds_np
        self.offsets_np[slots_np] = offsets_np
        staged = self.seed_staging[:, :n].to(self.device, non_blocking=True)
        self.state[0].index_copy_(0, staged[0], staged[1])
        self.state[1].index_copy_(0, staged[0], staged[2])

    def set_last_tokens(self, slots: torch.Tensor, ids: torch.Tensor) -> None:
        self.state[2].index_copy_(0, slots, ids)

    def advance(self, slots: torch.Tensor) -> None:
        self.state[1].index_add_(0, slots, torch.ones_like(slots))

    def snapshot_offsets(self) -> None:
        """Mirror the device offsets so a preempted request can resume its stream."""
        self.offsets_host.copy_(self.offsets)  # expect: FC101
        self.offsets_np[:] = self.offsets_host.numpy()
