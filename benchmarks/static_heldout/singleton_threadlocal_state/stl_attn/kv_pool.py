"""Paged KV cache, one pool per device shared by the worker threads of that device, and its compactor."""

from __future__ import annotations

import threading
from typing import ClassVar, Dict, List, Optional, Sequence, Tuple

import torch

from stlserve.config import EngineConfig


class KVPool:
    _POOLS: ClassVar[Dict[torch.device, "KVPool"]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def for_device(cls, device: torch.device) -> "KVPool":
        pool = cls._POOLS.get(device)
        if pool is None:
            with cls._lock:
                pool = cls._POOLS.get(device)
                if pool is None:
                    pool = cls(EngineConfig.get_instance(), device)
                    cls._POOLS[device] = pool
        return pool

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        shape = (cfg.num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.device = device
        self.num_pages = cfg.num_pages
        # the MTP draft head keeps its own KV layer after the model's
        num_kv_layers = cfg.num_layers + (1 if cfg.num_draft_tokens > 0 else 0)
        self.k_caches: List[torch.Tensor] = [
            torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(num_kv_layers)
        ]
        self.v_caches: List[torch.Tensor] = [
            torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(num_kv_layers)
        ]
        self.page_owner = torch.full((cfg.num_pages,), -1, dtype=torch.int32, device=device)

    def layer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k_caches[layer_id], self.v_caches[layer_id]

    def store(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        heads, dim = k.shape[-2:]
        self.k_caches[layer_id].view(-1, heads, dim)[loc] = k
        self.v_caches[layer_id].view(-1, heads, dim)[loc] = v


class KVCompactor:
    """Moves pages to close holes in the pool; runs on the scheduler's defragmentation thread."""

    _instance: ClassVar[Optional["KVCompactor"]] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def get_instance(cls) -> "KVCompactor":
        if cls._instance is None:
            with cls._lock:
                if cls._instance is None:
                    cls._instance = cls()
        return cls._instance

    def __init__(self) -> None:
        self.moved_pages = 0
        self.passes = 0

    def compact(self, device: torch.device, moves: Sequence[Tuple[int, int]]) -> int:
        """Copy pages ``src -> dst`` and point every graph runner of ``device`` at the new pages."""
        from stlserve.graph_runner import ThreadGraphRunner

        if not moves:
            return 0
        pool = KVPool.for_device(device)
        src = torch.tensor([s for s, _ in moves], dtype=torch.int64).pin_memory().to(device, non_blocking=True)
        dst = torch.tensor([d for _, d in moves], dtype=torch.int64).pin_memory().to(device, non_blocking=True)
        for k_cache, v_cache in zip(pool.k_caches, pool.v_caches):
            k_cache[dst] = k_cache[src]
            v_cache[dst] = v_cache[src]
        pool.page_owner[dst] = pool.page_owner[src]
        pool.page_owner[src] = -1

        mapping = torch.arange(pool.num_pages, dtype=torch.int32, device=device)
        mapping[src] = dst.to(torch.int32)
        # Graph runners keep the page list of their last step in their bound buffer; rewrite it in place so
        # that the next replay reads the moved pages.
        for runner in ThreadGraphRunner.all_runners():
            if runner.device != device:
                continue
            bufs = runner.bufs
            nnz = bufs.nnz
            bufs.kv_indices[:nnz] = mapping[bufs.kv_indices[:nnz].long()]  # expect: FC104
        self.moved_pages += len(moves)
        self.passes += 1
        return len(moves)
