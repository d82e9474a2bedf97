"""Loads adapters into slots on a side stream while the decode graphs keep replaying."""

import logging
from typing import Dict, Iterable, List, Optional

import torch

from loraswap.config import LoRAServeConfig
from loraswap.slots import AdapterSlotTable, AdapterWeights

logger = logging.getLogger(__name__)


class AdapterRegistry:
    """Host-side store of adapters that may be requested (pinned CPU tensors)."""

    def __init__(self):
        self._adapters: Dict[str, AdapterWeights] = {}

    def register(self, weights: AdapterWeights) -> None:
        self._adapters[weights.adapter_id] = weights

    def get(self, adapter_id: str) -> AdapterWeights:
        return self._adapters[adapter_id]

    def expected_version(self, adapter_id: str) -> int:
        return self._adapters[adapter_id].version


class SwapManager:
    def __init__(self, table: AdapterSlotTable, cfg: LoRAServeConfig, device: torch.device):
        self.table = table
        self.cfg = cfg
        self.device = device
        self.side_stream = torch.cuda.Stream(device=device)
        self._copy_done: Dict[int, torch.cuda.Event] = {}
        self._staging: Optional[torch.Tensor] = None

    def load(self, weights: AdapterWeights, slot: Optional[int] = None) -> int:
        assert weights.rank <= 4 * self.cfg.max_lora_rank, f"rank {weights.rank} too large"  # expect: FC109
        if slot is None:
            slot = self.table.lru_slot()
        self.table.grow_rank(weights.rank)
        if self._staging is None:
            self._staging = torch.empty(self.cfg.max_lora_rank, self.cfg.hidden_size, dtype=torch.float16, device=self.device)  # ok: FC107
        self.table.assign(weights.adapter_id, slot)
        r = weights.rank
        with torch.cuda.stream(self.side_stream):
            for m in self.cfg.target_modules:
                for layer, (a, b) in enumerate(zip(weights.lora_a[m], weights.lora_b[m])):
                    self.table.lora_a[m][slot, layer, :r].copy_(a, non_blocking=True)
                    self.table.lora_a[m][slot, layer, r:].zero_()
                    self.table.lora_b[m][slot, layer, :, :r].copy_(b, non_blocking=True)
                    self.table.lora_b[m][slot, layer, :, r:].zero_()
            self.table.scaling[slot].fill_(weights.scaling)
            self.table.slot_versions[slot] = weights.version
            done = torch.cuda.Event()
            done.record(self.side_stream)
        self._copy_done[slot] = done
        self.table.slot_versions_np[slot] = weights.version
        return slot

    def ensure_resident(self, adapter_ids: Iterable[Optional[str]], registry: AdapterRegistry) -> List[int]:
        touched = []
        for aid in sorted({a for a in adapter_ids if a}):
            slot = self.table.slot_of.get(aid)
            if slot is not None and self.table.slot_versions_np[slot] == registry.expected_version(aid):  # ok: FC101
                continue
            if slot is not None:
                prev = self._copy_done.pop(slot, None)
                if prev is not None:
                    # the slot is rewritten in place: wait for the previous copy first
                    prev.synchronize()  # expect: FC101
            touched.append(self.load(registry.get(aid), slot))
        return touched

    def wait_ready(self, compute_stream: torch.cuda.Stream, slots: List[int]) -> None:
        for slot in slots:
            evt = self._copy_done.pop(slot, None)
            if evt is not None:
                compute_stream.wait_event(evt)  # ok: FC101

    def unload_idle(self, keep: int) -> List[str]:
        """Run by the housekeeping thread between steps, never by the step itself."""
        live = self.table.slot_versions.nonzero().flatten().tolist()  # ok: FC101
        dropped = []
        for slot in sorted(live, key=lambda s: self.table.last_used.get(s, 0.0))[: max(0, len(live) - keep)]:
            aid = self.table.release(slot)
            if aid is not None:
                dropped.append(aid)
        logger.info("unloaded %d idle adapters", len(dropped))
        return dropped
