"""Physical expert slots, which logical expert each holds, and the greedy rebalancing plan."""

from __future__ import annotations

import numpy as np


class ExpertPlacement:
    """``num_physical`` slots (``num_physical - num_logical`` of them redundant replicas) over ``ep_size`` ranks."""

    def __init__(self, num_logical: int, num_physical: int, ep_size: int) -> None:
        assert num_physical % ep_size == 0, "physical expert slots must split evenly over the EP ranks"  # expect: FC109
        if num_physical < num_logical:
            raise ValueError(f"{num_physical} slots cannot hold {num_logical} experts")
        self.num_logical = num_logical
        self.num_physical = num_physical
        self.ep_size = ep_size
        self.slots_per_rank = num_physical // ep_size
        self.phy2log = np.arange(num_physical, dtype=np.int32) % num_logical
        self.log2phy_np = self._derive_log2phy(self.phy2log)
        self.version = 0

    def _derive_log2phy(self, phy2log: np.ndarray) -> np.ndarray:
        """One replica per logical expert for routing: the first slot that holds it (rank-major)."""
        out = np.full(self.num_logical, -1, dtype=np.int32)
        for slot in range(phy2log.shape[0] - 1, -1, -1):
            out[phy2log[slot]] = slot
        if (out < 0).any():
            raise ValueError("placement leaves a logical expert without a slot")
        return out

    def update(self, new_phy2log: np.ndarray) -> np.ndarray:
        """Install a new placement; returns the slots whose expert changed."""
        moved = np.flatnonzero(new_phy2log != self.phy2log)
        self.phy2log = new_phy2log.astype(np.int32, copy=True)
        self.log2phy_np = self._derive_log2phy(self.phy2log)
        self.version += 1
        return moved

    def rank_of_slot(self, slot: int) -> int:
        return slot // self.slots_per_rank


def create_balance_plan(slot_load: np.ndarray, placement: ExpertPlacement) -> np.ndarray:
    """Greedy EPLB: replicate the hottest experts into the redundant slots, then pack ranks by load.

    ``slot_load`` is ``[layers, num_physical]`` tokens per slot over the last window; layers are summed (one
    placement for the whole model, as the weight copy is per slot).
    """
    per_slot = slot_load.sum(axis=0).astype(np.float64)
    logical_load = np.zeros(placement.num_logical, dtype=np.float64)
    np.add.at(logical_load, placement.phy2log, per_slot)

    replicas = np.ones(placement.num_logical, dtype=np.int64)
    for _ in range(placement.num_physical - placement.num_logical):
        replicas[np.argmax(logical_load / replicas)] += 1

    # one entry per replica, heaviest first, each carrying its share of the expert's load
    experts = np.repeat(np.arange(placement.num_logical), replicas)
    shares = (logical_load / replicas)[experts]
    order = np.argsort(-shares, kind="stable")

    rank_load = np.zeros(placement.ep_size, dtype=np.float64)
    rank_fill = np.zeros(placement.ep_size, dtype=np.int64)
    new_phy2log = np.empty(placement.num_physical, dtype=np.int32)
    for idx in order:
        open_ranks = np.flatnonzero(rank_fill < placement.slots_per_rank)
        r = open_ranks[np.argmin(rank_load[open_ranks])]
        new_phy2log[r * placement.slots_per_rank + rank_fill[r]] = experts[idx]
        rank_fill[r] += 1
        rank_load[r] += shares[idx]
    return new_phy2log
