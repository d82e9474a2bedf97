"""Periodic rebalancing: a new placement from the last window's load, expert weights copied into the slots the
captured graphs read, the routing table updated in place."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, List

import numpy as np
import torch

from eplb.placement import ExpertPlacement, create_balance_plan
from eplb.recorder import ExpertLoadRecorder

if TYPE_CHECKING:
    from srt_moe.moe_layer import EPMoE

logger = logging.getLogger(__name__)


class EplbManager:
    def __init__(
        self,
        placement: ExpertPlacement,
        recorder: ExpertLoadRecorder,
        moe_layers: List["EPMoE"],
        rebalance_every: int,
        min_gain: float = 0.05,
    ) -> None:
        self.placement = placement
        self.recorder = recorder
        self.moe_layers = moe_layers
        self.rebalance_every = rebalance_every
        self.min_gain = min_gain
        self.copy_stream = torch.cuda.Stream()

    def maybe_rebalance(self, step: int) -> bool:
        if step % self.rebalance_every:
            return False
        snap = self.recorder.take_snapshot()
        if snap is None:
            return False
        return self.rebalance(snap)

    def rebalance(self, snap: torch.Tensor) -> bool:
        load = snap.cpu()  # ok: FC101
        load_np = load.numpy()
        new_phy2log = create_balance_plan(load_np, self.placement)
        before = self._imbalance(load_np, self.placement.phy2log)
        after = self._imbalance(load_np, new_phy2log)
        if before - after < self.min_gain * before:
            logger.info("EPLB: imbalance %.3f -> %.3f, not worth moving experts", before, after)
            return False
        self.apply_placement(new_phy2log)
        logger.info("EPLB v%d: imbalance %.3f -> %.3f", self.placement.version, before, after)
        return True

    def _imbalance(self, load_np: np.ndarray, phy2log: np.ndarray) -> float:
        per_slot = load_np.sum(axis=0).astype(np.float64)
        logical = np.zeros(self.placement.num_logical)
        np.add.at(logical, self.placement.phy2log, per_slot)
        counts = np.bincount(phy2log, minlength=self.placement.num_logical)
        slot_share = logical[phy2log] / counts[phy2log]
        ranks = slot_share.reshape(self.placement.ep_size, -1).sum(axis=1)
        return float(ranks.max() / max(ranks.mean(), 1e-9))

    def apply_placement(self, new_phy2log: np.ndarray) -> None:
        assert new_phy2log.shape == self.placement.phy2log.shape, "placement size changed"  # expect: FC109
        old = self.placement.phy2log.copy()
        moved = self.placement.update(new_phy2log)
        log2phy = torch.from_numpy(self.placement.log2phy_np).pin_memory()
        with torch.cuda.stream(self.copy_stream):
            for layer in self.moe_layers:
                for slot in moved.tolist():
                    expert = int(new_phy2log[slot])
                    layer.w13_weight[slot].copy_(layer.w13_host[expert], non_blocking=True)  # ok: FC104
                    layer.w2_weight[slot].copy_(layer.w2_host[expert], non_blocking=True)
                layer.log2phy_buf.copy_(log2phy, non_blocking=True)
        torch.cuda.current_stream().wait_stream(self.copy_stream)
        logger.debug("EPLB moved %d of %d slots (was %s)", len(moved), old.size, old[moved][:8])
