"""A device LRU of prompt embeddings and layer-0 KV pages, keyed by prompt hash on the host."""
from __future__ import annotations

import collections
from typing import List, Optional

import torch

import flashcheck

from .config import ServerConfig


class EmbeddingLRU:
    def __init__(self, cfg: ServerConfig, device: torch.device):
        self.max_prompt_len = cfg.max_cached_prompt_len
        self.pages_per_slot = cfg.pages_per_cached_prompt
        self.page_size = cfg.page_size
        self.num_slots = cfg.cache_slots
        self.emb_store = torch.empty(cfg.cache_slots, self.max_prompt_len, cfg.hidden_size,
                                     dtype=torch.bfloat16, device=device)
        self.kv0_store = torch.empty(cfg.cache_slots * self.pages_per_slot, 2, cfg.page_size, cfg.num_kv_heads,
                                     cfg.head_dim, dtype=torch.bfloat16, device=device)
        # set on the copy stream once an entry's copies have landed
        self.valid_dev = torch.zeros(cfg.cache_slots, dtype=torch.bool, device=device)
        self.hits_dev = torch.zeros(cfg.cache_slots, dtype=torch.int64, device=device)
        self.lens_hostbuf = torch.zeros(cfg.cache_slots, dtype=torch.int32, pin_memory=True)
        self._order: "collections.OrderedDict[bytes, int]" = collections.OrderedDict()
        self._free: List[int] = list(range(cfg.cache_slots - 1, -1, -1))
        self.copy_stream = torch.cuda.Stream(device)

    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        _, slot = self._order.popitem(last=False)
        self.valid_dev[slot] = False
        return slot

    def insert(self, key: bytes, embeds: torch.Tensor, kv0_pages: torch.Tensor) -> int:
        """Cache a prompt's embeddings and its layer-0 KV pages (copied on the side stream)."""
        assert embeds.shape[0] <= self.max_prompt_len, "prompt too long to cache"  # expect: FC109
        slot = self._take_slot()
        n = embeds.shape[0]
        n_pages = kv0_pages.shape[0]
        base = slot * self.pages_per_slot
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            self.emb_store[slot, :n].copy_(embeds, non_blocking=True)
            self.kv0_store[base : base + n_pages].copy_(kv0_pages, non_blocking=True)
            self.valid_dev[slot] = True
        self.lens_hostbuf[slot] = n
        self._order[key] = slot
        return slot

    @flashcheck.hot_path
    def lookup_batch(self, keys: List[bytes], lens: List[int]) -> List[Optional[int]]:
        slots: List[Optional[int]] = []
        for i, key in enumerate(keys):
            slot = self._order.get(key)
            if slot is None or not bool(self.valid_dev[slot]):  # expect: FC101
                slots.append(None)
                continue
            self._order.move_to_end(key)
            self._check_prefix_len(slot, lens[i])
            slots.append(slot)
        hit = [s for s in slots if s is not None]
        if hit:
            self.hits_dev[torch.tensor(hit, dtype=torch.int64).to(self.hits_dev.device, non_blocking=True)] += 1
        return slots

    def _check_prefix_len(self, slot: int, prompt_len: int) -> None:
        assert 0 < prompt_len <= self.max_prompt_len, f"slot {slot}: bad prompt length"  # expect: FC109
