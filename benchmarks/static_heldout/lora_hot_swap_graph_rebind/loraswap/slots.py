"""Fixed adapter slots that the captured decode graphs read by index.

The graphs never see an adapter directly: each row carries a slot index in
``row_adapter_idx`` and the LoRA kernels gather ``lora_a``/``lora_b`` rows by it,
so loading an adapter is a copy into a slot, never a rebinding.
"""

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

from loraswap.config import LoRAServeConfig


@dataclass
class AdapterWeights:
    adapter_id: str
    rank: int
    scaling: float
    version: int
    lora_a: Dict[str, List[torch.Tensor]] = field(default_factory=dict)  # module -> per layer [rank, in]
    lora_b: Dict[str, List[torch.Tensor]] = field(default_factory=dict)  # module -> per layer [out, rank]


class AdapterSlotTable:
    def __init__(self, cfg: LoRAServeConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.rank_capacity = cfg.max_lora_rank
        S, L, R = cfg.max_loras, cfg.num_layers, cfg.max_lora_rank
        dims = {m: cfg.module_dims(m) for m in cfg.target_modules}
        self.lora_a: Dict[str, torch.Tensor] = {
            m: torch.zeros(S, L, R, d_in, dtype=torch.float16, device=device) for m, (d_in, _) in dims.items()
        }
        self.lora_b: Dict[str, torch.Tensor] = {
            m: torch.zeros(S, L, d_out, R, dtype=torch.float16, device=device) for m, (_, d_out) in dims.items()
        }
        self.scaling = torch.zeros(S, dtype=torch.float32, device=device)
        self.slot_versions = torch.zeros(S, dtype=torch.int64, device=device)
        self.slot_versions_np = np.zeros(S, dtype=np.int64)
        self.row_adapter_idx = torch.full((cfg.max_batch_size,), -1, dtype=torch.int32, device=device)
        self.row_adapter_idx_cpu = torch.full((cfg.max_batch_size,), -1, dtype=torch.int32, pin_memory=True)
        self.slot_of: Dict[str, int] = {}
        self.adapter_in: Dict[int, str] = {}
        self.free_slots: List[int] = list(range(S))
        self.last_used: Dict[int, float] = {}

    def assign(self, adapter_id: str, slot: int) -> None:
        assert 0 <= slot < self.cfg.max_loras, "slot out of range"  # expect: FC109
        old = self.adapter_in.pop(slot, None)
        if old is not None:
            self.slot_of.pop(old, None)
        if slot in self.free_slots:
            self.free_slots.remove(slot)
        self.slot_of[adapter_id] = slot
        self.adapter_in[slot] = adapter_id
        self.last_used[slot] = time.monotonic()
        self._check_tables()

    def release(self, slot: int) -> Optional[str]:
        aid = self.adapter_in.pop(slot, None)
        if aid is not None:
            self.slot_of.pop(aid, None)
            self.free_slots.append(slot)
        self._check_tables()
        return aid

    def _check_tables(self) -> None:
        assert len(self.slot_of) + len(self.free_slots) == self.cfg.max_loras  # ok: FC109

    def grow_rank(self, rank: int) -> None:
        """Adapters of a larger rank than any seen so far need wider slots."""
        if rank <= self.rank_capacity:
            return
        S, L = self.cfg.max_loras, self.cfg.num_layers
        for m in self.cfg.target_modules:
            d_in, d_out = self.cfg.module_dims(m)
            self.lora_a[m] = torch.zeros(S, L, rank, d_in, dtype=torch.float16, device=self.device)  # expect: FC107
            self.lora_b[m] = torch.zeros(S, L, d_out, rank, dtype=torch.float16, device=self.device)  # expect: FC107
        self.rank_capacity = rank

    def fill_rows(self, adapter_ids: List[Optional[str]]) -> int:
        n = len(adapter_ids)
        for i, aid in enumerate(adapter_ids):
            slot = self.slot_of.get(aid, -1) if aid else -1
            self.row_adapter_idx_cpu[i] = slot
            if slot >= 0:
                self.last_used[slot] = time.monotonic()
        self.row_adapter_idx[:n].copy_(self.row_adapter_idx_cpu[:n], non_blocking=True)
        return n

    def lru_slot(self) -> int:
        if self.free_slots:
            return self.free_slots[0]
        return min(self.last_used, key=self.last_used.get)
