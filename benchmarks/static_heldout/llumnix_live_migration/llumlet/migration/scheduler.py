"""Llumnix-style migration policy: move requests from the instance with the highest virtual usage to the
one with the lowest, keeping headroom for high-priority requests."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class InstanceLoad:
    instance_id: int
    rank: int
    used_blocks: int
    num_blocks: int
    num_running: int
    high_priority_headroom: int = 0
    candidates: list = field(default_factory=list)  # (rid, seq_len) of requests that may move


@dataclass
class MigrationDecision:
    src_id: int
    dst_id: int
    dst_rank: int
    rid: int


class MigrationScheduler:
    def __init__(self, threshold: float, max_inflight: int):
        self.threshold = threshold
        self.max_inflight = max_inflight
        self._inflight: dict[int, MigrationDecision] = {}

    @staticmethod
    def virtual_usage(load: InstanceLoad) -> float:
        return (load.used_blocks + load.high_priority_headroom) / max(load.num_blocks, 1)

    def _check_capacity(self) -> None:
        assert len(self._inflight) <= self.max_inflight, "migration slots overcommitted"  # ok: FC109

    def pair_for_migration(self, src: InstanceLoad, dst: InstanceLoad, rid: int) -> MigrationDecision:
        assert src.instance_id != dst.instance_id, "cannot migrate a request to its own instance"  # expect: FC109
        self._check_capacity()
        decision = MigrationDecision(src.instance_id, dst.instance_id, dst.rank, rid)
        self._inflight[rid] = decision
        return decision

    def decide(self, loads: list) -> list:
        if len(loads) < 2 or len(self._inflight) >= self.max_inflight:
            return []
        usage = np.array([self.virtual_usage(l) for l in loads])
        src, dst = loads[int(usage.argmax())], loads[int(usage.argmin())]
        if usage.max() - usage.min() < self.threshold or not src.candidates:
            return []
        rid, _ = min(src.candidates, key=lambda c: c[1])  # shortest request moves fastest
        return [self.pair_for_migration(src, dst, rid)]

    def complete(self, rid: int) -> None:
        self._inflight.pop(rid, None)
