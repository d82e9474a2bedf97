"""LoRA adapter bank: stacked weights per slot, adapter-indexed gathers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import torch

from .config import AdapterSpec, RouterConfig


@dataclass
class SegmentInfo:
    num_active: int
    seg_starts: torch.Tensor


class AdapterBank:
    def __init__(self, cfg: RouterConfig, specs: List[AdapterSpec], device: torch.device):
        self.cfg = cfg
        self.device = device
        self.max_rank = cfg.max_rank
        self.max_adapters = cfg.max_adapters
        shape = (cfg.max_adapters, cfg.num_layers)
        self.lora_a = torch.zeros(*shape, cfg.hidden_size, cfg.max_rank, dtype=torch.bfloat16, device=device)
        self.lora_b = torch.zeros(*shape, cfg.max_rank, cfg.hidden_size, dtype=torch.bfloat16, device=device)
        loras = [s for s in specs if s.kind == "lora"]
        self.slot_of: Dict[str, int] = {s.name: i for i, s in enumerate(loras)}
        self.free_slots = list(range(len(loras), cfg.max_adapters))
        self.scaling = torch.tensor([s.alpha / s.rank for s in loras], dtype=torch.float32, device=device)
        self.batch_scaling = torch.zeros(cfg.max_batch, dtype=torch.float32, device=device)
        self.usage = torch.zeros(cfg.max_adapters, dtype=torch.int64, device=device)
        self._backend = "sgmv" if cfg.max_adapters > 4 else "bgmv"

    def load_adapter(self, name: str, rank: int, a: torch.Tensor, b: torch.Tensor) -> int:
        assert rank <= self.max_rank, "adapter rank exceeds the bank"  # expect: FC109
        assert self.free_slots, "no free adapter slot"  # ok: FC109
        slot = self.free_slots.pop(0)
        self.lora_a[slot, :, :, :rank].copy_(a, non_blocking=True)
        self.lora_b[slot, :, :rank, :].copy_(b, non_blocking=True)
        self.slot_of[name] = slot
        return slot

    def unload_adapter(self, name: str) -> None:
        slot = self.slot_of.pop(name)
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        self.free_slots.append(slot)
        self._check_slots()

    def _check_slots(self) -> None:
        assert len(self.slot_of) + len(self.free_slots) == self.max_adapters  # ok: FC109

    def gather_for_batch(self, lora_ids: torch.Tensor) -> SegmentInfo:
        n = lora_ids.shape[0]
        self.batch_scaling[:n].copy_(self.scaling[lora_ids])
        self.usage.index_add_(0, lora_ids, torch.ones_like(lora_ids))
        if self._backend == "sgmv":  # ok: FC103
            num_active = torch.unique(lora_ids).numel()  # expect: FC101
        else:
            num_active = n
        sorted_ids, _ = torch.sort(lora_ids)
        starts = torch.searchsorted(sorted_ids, torch.arange(self.max_adapters, device=self.device))
        return SegmentInfo(num_active=num_active, seg_starts=starts)
