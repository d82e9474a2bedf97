"""Cross-attention K/V: computed once per request from the encoder output, kept until the request is gone.

The ragged cross-attention kernel reads one contiguous K/V run per request, so the cache keeps a packed copy in
the order of the running batch and repacks only when the batch changes (requests join or finish)."""

from __future__ import annotations

import weakref
from typing import Dict, List, Sequence, Tuple

import torch


class CrossKVCache:
    def __init__(self, num_layers: int, max_reqs: int, max_source_positions: int, num_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (num_layers, max_reqs * max_source_positions, num_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._store: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}
        # request objects own their cross K/V: once the scheduler drops a request, its entry may go
        self._owners: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()
        self._order: List[str] = []

    def put(self, rid: str, k: torch.Tensor, v: torch.Tensor, owner: object) -> None:
        assert k.shape == v.shape, "cross K and V projections disagree"  # expect: FC109
        self._store[rid] = (k, v)
        self._owners[rid] = owner

    def pack(self, rids: Sequence[str]) -> bool:
        """Lay the batch's K/V out back to back; returns whether anything moved."""
        if list(rids) == self._order:
            return False
        off = 0
        for rid in rids:
            k, v = self._store[rid]
            n = k.shape[1]
            self.k[:, off : off + n].copy_(k, non_blocking=True)
            self.v[:, off : off + n].copy_(v, non_blocking=True)
            off += n
        self._order = list(rids)
        return True

    def release_dead(self) -> int:
        dead = [rid for rid in self._store if rid not in self._owners]
        for rid in dead:
            del self._store[rid]
        assert len(self._store) == len(self._owners), "cross K/V owner without an entry"  # ok: FC109
        return len(dead)
