"""Batched LoRA over the slot buffers: a per-row gather of slot weights (BGMV, written in torch)."""

from __future__ import annotations

import torch

from loraslots.adapters import AdapterSlotTable


class SlotLoraOps:
    def __init__(self, table: AdapterSlotTable) -> None:
        self.table = table
        self._backend = "torch-bgmv"
        self.active_rank = table.max_rank

    def describe(self) -> str:
        return f"{self._backend} rank<={self.active_rank} slots={self.table.num_slots}"

    def apply(self, layer: int, x: torch.Tensor, base: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
        """``base + scale[slot] * (x @ A[slot]) @ B[slot]`` per row; slot 0 is all zeros."""
        r = self.active_rank
        ab = self.table.lora_ab[layer].index_select(0, slot_ids)
        a = ab[:, 0, :, :r]
        bt = ab[:, 1, :, :r]
        shrink = torch.bmm(x.unsqueeze(1), a)
        delta = torch.bmm(shrink, bt.transpose(1, 2)).squeeze(1)
        scale = self.table.scaling.index_select(0, slot_ids).unsqueeze(-1)
        return base + delta * scale
