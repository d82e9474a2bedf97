"""Adapter registry: host-pinned LoRA weights, hot-loaded into pool pages when a batch needs them."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np
import torch

from slora.config import SLoRAConfig
from slora.pool import KIND_ADAPTER, UnifiedPagePool

if TYPE_CHECKING:
    from slora_engine.attention import UnifiedPagedAttention


@dataclass
class AdapterSlot:
    adapter_id: str
    index: int
    rank: int
    host_weights: torch.Tensor  # pinned, [num_layers, pages_per_adapter, page_elems]
    pages_np: Optional[np.ndarray] = None
    resident: bool = False
    last_step: int = 0


class AdapterRegistry:
    def __init__(self, cfg: SLoRAConfig, pool: UnifiedPagePool, attn: "UnifiedPagedAttention", device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.attn = attn
        self.device = device
        self.max_rank = cfg.max_rank
        self.slots: Dict[str, AdapterSlot] = {}
        self.slot_rank_gpu = torch.zeros(cfg.max_adapters, dtype=torch.int32, device=self.device)
        self.slot_pages_gpu = torch.zeros(
            (cfg.max_adapters, cfg.pages_per_adapter), dtype=torch.int64, device=self.device
        )
        self.load_stream = torch.cuda.Stream()
        self.load_event = torch.cuda.Event()
        self._backend = "pinned-host"
        self._next_index = 0

    def register(self, adapter_id: str, rank: int, host_weights: torch.Tensor) -> AdapterSlot:
        assert rank <= self.max_rank, "adapter rank exceeds the pool's max rank"  # expect: FC109
        if not host_weights.is_pinned():
            host_weights = host_weights.pin_memory()
        slot = AdapterSlot(adapter_id, self._next_index, rank, host_weights)
        self._next_index += 1
        self.slots[adapter_id] = slot
        self.slot_rank_gpu[slot.index] = rank
        return slot

    def _audit_pool(self) -> None:
        assert self.pool.num_free() >= 0  # ok: FC109

    def ensure_loaded(self, adapter_ids: List[str], step: int) -> None:
        """Make every adapter of the batch resident, evicting KV pages of preempted requests if needed."""
        missing = [self.slots[a] for a in set(adapter_ids) if not self.slots[a].resident]
        for a in adapter_ids:
            self.slots[a].last_step = step
        if not missing:
            return
        need = len(missing) * self.cfg.pages_per_adapter
        short = need - self.pool.num_free()
        if short > 0:
            victims = self.pool.evict_kv(short)
            self.attn.scrub_pages(torch.from_numpy(victims).to(self.device), victims)
        with torch.cuda.stream(self.load_stream):
            for slot in missing:
                pages = self.pool.alloc(self.cfg.pages_per_adapter, KIND_ADAPTER, slot.index)
                slot.pages_np = pages
                idx = torch.from_numpy(pages).to(self.device, non_blocking=True)
                for layer in range(self.cfg.num_layers):
                    rows = slot.host_weights[layer].to(self.device, non_blocking=True)
                    self.pool.pages[layer].index_copy_(0, idx, rows)
                self.slot_pages_gpu[slot.index].copy_(idx)
                slot.resident = True
            self.load_event.record()
        self.load_event.synchronize()  # expect: FC101
        self._audit_pool()

    def adapter_stacks(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """A and B of every slot for one layer, gathered from their pool pages."""
        c = self.cfg
        flat = self.pool.pages[layer].index_select(0, self.slot_pages_gpu.flatten())
        both = flat.view(c.max_adapters, -1)[:, : 2 * c.hidden_size * c.max_rank]
        a, b = both.view(c.max_adapters, 2, c.hidden_size, c.max_rank).unbind(1)
        return a, b.transpose(1, 2)
