"""Pinned soft-prompt pages per tenant."""
from __future__ import annotations

import logging
from typing import Dict, List, Tuple

import numpy as np
import torch

logger = logging.getLogger(__name__)


class SoftPromptRegistry:
    """Tenants' prefix-tuning KV, written once into pages the allocator never evicts.

    The page table lives twice: on the device (for lookups inside a step) and in numpy (for
    the planner).  Page ids come from a reserved range at the bottom of the KV pool.
    """

    def __init__(
        self,
        num_layers: int,
        page_size: int,
        max_tenants: int,
        max_virtual_tokens: int,
        reserved_pages: int,
        device: torch.device,
        loader_backend: str = "pinned",
    ):
        self.num_layers = num_layers
        self.page_size = page_size
        self.max_tenants = max_tenants
        self.max_pages_per_tenant = (max_virtual_tokens + page_size - 1) // page_size
        self.device = device
        self._backend = loader_backend
        self.pin_budget = reserved_pages
        self.page_counts = torch.zeros(max_tenants, dtype=torch.int32, device=self.device)
        self.last_page_len = torch.ones(max_tenants, dtype=torch.int32, device=self.device)
        self.num_virtual_tokens = torch.zeros(max_tenants, dtype=torch.int64, device=self.device)
        self.page_table_np = np.zeros((max_tenants, self.max_pages_per_tenant), dtype=np.int32)
        self.page_counts_np = np.zeros(max_tenants, dtype=np.int32)
        self.last_page_len_np = np.ones(max_tenants, dtype=np.int32)
        self.slots: Dict[str, int] = {}
        self._free_slots: List[int] = list(range(max_tenants - 1, -1, -1))
        self._free_list: List[int] = list(range(reserved_pages))
        self._num_free = reserved_pages

    @property
    def num_tenants(self) -> int:
        return len(self.slots)

    @property
    def total_pinned_pages(self) -> int:
        return int(self.page_counts.sum())  # expect: FC101

    # -- registration ------------------------------------------------------------------

    def _take_pages(self, n: int) -> List[int]:
        assert len(self._free_list) == self._num_free  # ok: FC109
        if n > self._num_free:
            raise MemoryError(f"soft prompt needs {n} pinned pages, {self._num_free} left")
        pages, self._free_list = self._free_list[:n], self._free_list[n:]
        self._num_free -= n
        return pages

    def _load(self, prefix_kv: torch.Tensor) -> torch.Tensor:
        if self._backend == "pinned":  # ok: FC103
            return prefix_kv.pin_memory().to(self.device, non_blocking=True)
        return prefix_kv.to(self.device)

    def register(self, tenant: str, prefix_kv: torch.Tensor, kv_buffers: List[torch.Tensor]) -> int:
        """prefix_kv: [num_layers, 2, num_virtual_tokens, num_kv_heads, head_dim]."""
        assert prefix_kv.shape[0] == self.num_layers  # expect: FC109
        n_virtual = prefix_kv.shape[2]
        n_pages = (n_virtual + self.page_size - 1) // self.page_size
        pages = self._take_pages(n_pages)
        slot = self._free_slots.pop()
        kv = self._load(prefix_kv)
        page_ids = torch.tensor(pages, dtype=torch.int64, device=self.device)
        pad = n_pages * self.page_size - n_virtual
        kv = torch.nn.functional.pad(kv, (0, 0, 0, 0, 0, pad))
        for layer in range(self.num_layers):
            blocks = kv[layer].view(2, n_pages, self.page_size, *kv.shape[-2:]).transpose(0, 1)
            kv_buffers[layer].index_copy_(0, page_ids, blocks)
        last = n_virtual - (n_pages - 1) * self.page_size
        self.page_table_np[slot, :n_pages] = pages
        self.page_counts_np[slot] = n_pages
        self.last_page_len_np[slot] = last
        self.page_counts[slot] = n_pages
        self.last_page_len[slot] = last
        self.num_virtual_tokens[slot] = n_virtual
        self.slots[tenant] = slot
        logger.info("tenant %s: %d virtual tokens pinned in %d pages", tenant, n_virtual, n_pages)
        return slot

    def evict_tenant(self, tenant: str) -> None:
        slot = self.slots.pop(tenant)
        n = self.page_counts[slot].item()  # ok: FC101
        self._free_list.extend(self.page_table_np[slot, :n].tolist())
        self._num_free += n
        self.page_counts[slot] = 0
        self.page_counts_np[slot] = 0
        self._free_slots.append(slot)

    def move(self, tenant: str, new_pages: List[int]) -> Tuple[List[int], List[int]]:
        slot = self.slots[tenant]
        n = int(self.page_counts_np[slot])
        old = self.page_table_np[slot, :n].tolist()
        self.page_table_np[slot, :n] = new_pages[:n]
        return old, list(new_pages[:n])

    # -- per step ----------------------------------------------------------------------

    def gather_pages(self, tenant_ids_cpu: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """indptr / indices / last-page lengths of each row's soft prompt, on the device."""
        slots = tenant_ids_cpu.numpy()
        idx = np.concatenate([self.page_table_np[s, : self.page_counts_np[s]] for s in slots])
        indices = torch.from_numpy(idx).to(self.device, non_blocking=True)
        tids = torch.from_numpy(slots.astype(np.int64)).to(self.device, non_blocking=True)
        indptr = torch.zeros(len(slots) + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(self.page_counts[tids], 0, out=indptr[1:])
        return indptr, indices, self.last_page_len[tids]

    def gather_pages_host(self, tenant_ids_cpu: torch.Tensor, pad_to: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The same on the host, padded with empty rows up to ``pad_to``."""
        slots = tenant_ids_cpu.numpy()
        counts = np.zeros(pad_to, dtype=np.int32)
        counts[: len(slots)] = self.page_counts_np[slots]
        indptr = np.zeros(pad_to + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        idx = np.concatenate([self.page_table_np[s, : self.page_counts_np[s]] for s in slots])
        last = np.ones(pad_to, dtype=np.int32)
        last[: len(slots)] = self.last_page_len_np[slots]
        return torch.from_numpy(indptr), torch.from_numpy(idx), torch.from_numpy(last)
