"""Pinned host store of KV chunks: one slot holds every layer of ``chunk_size`` tokens."""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Iterable, List, Sequence

import torch

from lmc_connector.config import ConnectorConfig, EngineLimits


def chunk_keys(token_ids: Sequence[int], chunk_size: int, model_tag: str) -> List[str]:
    """Rolling prefix hashes, one per full chunk."""
    keys: List[str] = []
    h = hashlib.blake2b(model_tag.encode(), digest_size=16)
    for start in range(0, len(token_ids) - chunk_size + 1, chunk_size):
        h.update(bytes(str(list(token_ids[start : start + chunk_size])), "ascii"))
        keys.append(h.hexdigest())
    return keys


class HostKVStore:
    def __init__(self, cfg: ConnectorConfig, limits: EngineLimits) -> None:
        self._backend = "local_cpu" if cfg.local_cpu else "remote"
        self.chunk_size = cfg.chunk_size
        chunk_bytes = limits.num_layers * 2 * cfg.chunk_size * limits.num_kv_heads * limits.head_dim * 2
        self.capacity = max(1, cfg.host_capacity_bytes // chunk_bytes)
        self.pool = torch.empty(
            self.capacity, limits.num_layers, 2, cfg.chunk_size, limits.num_kv_heads, limits.head_dim,
            dtype=torch.bfloat16, pin_memory=True,
        )
        self.index: "OrderedDict[str, int]" = OrderedDict()
        self.free: List[int] = list(range(self.capacity))
        self.committed_layers: dict = {}
        self.lock = threading.Lock()

    def lookup_prefix(self, keys: Iterable[str]) -> int:
        """Number of leading chunks fully present (all layers committed)."""
        hits = 0
        with self.lock:
            for key in keys:
                slot = self.index.get(key)
                if slot is None or self.committed_layers.get(key, 0) < self.pool.shape[1]:
                    break
                self.index.move_to_end(key)
                hits += 1
        return hits

    def _pop_lru(self) -> int:
        assert self.index, "host store is empty but has no free slot"  # ok: FC109
        key, slot = self.index.popitem(last=False)
        self.committed_layers.pop(key, None)
        return slot

    def reserve(self, key: str) -> int:
        with self.lock:
            if key in self.index:
                return self.index[key]
            slot = self.free.pop() if self.free else self._pop_lru()
            self.index[key] = slot
            self.committed_layers[key] = 0
            return slot

    def chunk_view(self, key: str, layer: int) -> torch.Tensor:
        return self.pool[self.index[key], layer]

    def put_layer(self, layer: int, keys: Sequence[str], staging: torch.Tensor) -> None:
        """Commit one layer of ``keys`` from a pinned staging tensor [2, tokens, heads, dim]."""
        assert staging.is_pinned(), "staging must be pinned host memory"  # expect: FC109
        with self.lock:
            for i, key in enumerate(keys):
                slot = self.index.get(key)
                if slot is None:
                    continue
                self.pool[slot, layer].copy_(staging[:, i * self.chunk_size : (i + 1) * self.chunk_size])
                self.committed_layers[key] = self.committed_layers.get(key, 0) + 1
