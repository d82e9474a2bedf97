"""Replay hooks: callable objects and closures the graph runner calls around every replay."""
from __future__ import annotations

import logging
from typing import Callable, Dict, Optional

import torch

from hookserve.batch import ReplayMeta

logger = logging.getLogger(__name__)


class LoraSlotHook:
    """Pre-replay: write each row's LoRA slot into the graph's static slot table (-1 for padded rows)."""
    def __init__(self, slot_table: torch.Tensor, num_slots: int) -> None:
        self.slot_table, self.num_slots = slot_table, num_slots
        self.slot_remap: Optional[torch.Tensor] = None

    def __call__(self, meta: ReplayMeta) -> None:
        fb, n = meta.batch, meta.batch.batch_size
        assert fb.adapter_ids.numel() == n, "one adapter id per request"  # expect: FC109
        if self.slot_remap is None:
            self.slot_remap = torch.arange(self.num_slots, dtype=torch.int64, device=fb.adapter_ids.device)  # ok: FC107
        self.slot_table[:n].copy_(self.slot_remap[fb.adapter_ids])  # ok: FC104
        self.slot_table[: meta.bs].masked_fill_(meta.pad_mask, -1)
        active = torch.unique(fb.adapter_ids)  # expect: FC101
        self.last_active = torch.zeros(self.num_slots, dtype=torch.bool, device=fb.adapter_ids.device)  # expect: FC107
        self.last_active[active] = True
        logger.debug("lora slots for bucket %d: %s", meta.bs, active)  # ok: FC101


class AcceptStats:
    """Replay counters; ``_plan_info`` counts replays per bucket (named after the planner's field)."""
    def __init__(self) -> None:
        self.tokens = self.max_len = 0
        self._plan_info: Dict[int, int] = {}  # ok: FC103

    def bump(self, bs: int) -> None:
        self._plan_info[bs] = self._plan_info.get(bs, 0) + 1  # ok: FC103


def make_accept_hook(stats: AcceptStats, num_draft: int) -> Callable[[ReplayMeta, torch.Tensor], None]:
    def on_replayed(meta: ReplayMeta, logits: torch.Tensor) -> None:
        stats.bump(meta.bs)
        stats.tokens += sum(meta.batch.seq_lens_cpu.tolist()) * (num_draft + 1)  # ok: FC101
        stats.max_len = max(stats.max_len, int(meta.batch.seq_lens.max()))  # expect: FC101

    return on_replayed
