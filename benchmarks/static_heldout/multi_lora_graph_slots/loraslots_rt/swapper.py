"""Adapter swaps between replays: pinned host weights -> staging -> a slot, on a copy stream."""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Set

import torch

from loraslots.adapters import ZERO_SLOT, AdapterSlotTable, AdapterStore
from loraslots.config import SlotConfig
from loraslots_rt.attention import LoraSlotAttention
from loraslots_rt.batch import Request


class SlotSwapper:
    def __init__(
        self,
        cfg: SlotConfig,
        store: AdapterStore,
        table: AdapterSlotTable,
        attn: LoraSlotAttention,
        device: torch.device,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.table = table
        self.attn = attn
        self.device = device
        self.copy_stream = torch.cuda.Stream(device=device)
        self.load_done = torch.cuda.Event()
        self.staging_dev: Optional[torch.Tensor] = None
        self.swaps = 0

    def swap_in(self, batch_adapters: Sequence[int], running: Dict[int, Request]) -> Dict[int, int]:
        """Make every adapter of the next batch resident; returns adapter id -> slot (-1 -> the zero slot)."""
        needed = [a for a in dict.fromkeys(batch_adapters) if a >= 0]
        if len(needed) > self.table.num_slots - 1:
            raise RuntimeError(f"{len(needed)} adapters in one batch, {self.table.num_slots - 1} slots")
        placement = {-1: ZERO_SLOT}
        pinned: Set[int] = set()
        loaded = False
        for aid in needed:
            slot = self.table.slot_of(aid)
            if slot < 0:
                slot = self._free_slot(pinned, running)
                self._load(aid, slot)
                loaded = True
            pinned.add(slot)
            placement[aid] = slot
        if loaded:
            torch.cuda.current_stream().wait_event(self.load_done)  # ok: FC101
        return placement

    def _free_slot(self, pinned: Set[int], running: Dict[int, Request]) -> int:
        free = (self.table.slot_adapter_dev[1:] < 0).nonzero().flatten().tolist()  # expect: FC101
        if free:
            return free[0] + 1
        victim = self.table.lru_victim(pinned)
        self._evict(victim, running)
        return victim

    def _evict(self, slot: int, running: Dict[int, Request]) -> None:
        """Park the requests of the evicted adapter until it is loaded again; their graph rows decode nothing."""
        rows = [r.row for r in running.values() if r.slot == slot and 0 <= r.row < self.cfg.max_graph_bs]
        for r in running.values():
            if r.slot == slot:
                r.slot = -1
        self.table.clear_slot(slot)
        if rows:
            idx = torch.tensor(rows, dtype=torch.int64, device=self.device)
            self.attn.graph_last_page_len.index_fill_(0, idx, 0)  # expect: FC104

    def _load(self, aid: int, slot: int) -> None:
        packed = self.store.packed(aid)
        rank = self.store.ranks[aid]
        if rank > self.table.max_rank:
            shape = (self.cfg.num_layers, self.table.num_slots, 2, self.cfg.hidden_size, rank)
            self.table.lora_ab = torch.zeros(shape, dtype=torch.float16, device=self.device)  # expect: FC107
            self.table.max_rank = rank
        if self.staging_dev is None:
            stage_shape = (self.cfg.num_layers, 2, self.cfg.hidden_size, self.cfg.max_rank)
            self.staging_dev = torch.empty(stage_shape, dtype=torch.float16, device=self.device)  # ok: FC107
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            stage = self.staging_dev[..., :rank]
            stage.copy_(packed, non_blocking=True)
            self.table.write_slot(slot, aid, stage, rank, self.store.scales[aid])
            self.load_done.record(self.copy_stream)
        self.swaps += 1
