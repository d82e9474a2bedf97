"""The per-step block copies of copy-on-write, and the in-place remap of the decode graphs' block ids.

``plan_copies`` stages the (src, dst) pairs the block manager queued; ``apply_copies`` copies the blocks in
every layer's cache and rewrites the affected ids in the graph's block-id list, so that a bucket whose layout
did not otherwise change can replay without a new ``plan()``.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import triton
import triton.language as tl

from beamserve.attention import BeamDecodeBackend
from beamserve.config import BeamConfig


@triton.jit
def _remap_block_ids_kernel(ids_ptr, n_ids, src_ptr, dst_ptr, n_pairs, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_ids
    ids = tl.load(ids_ptr + offs, mask=mask, other=-1)
    for j in range(n_pairs):
        src = tl.load(src_ptr + j).to(tl.int32)
        dst = tl.load(dst_ptr + j).to(tl.int32)
        ids = tl.where(ids == src, dst, ids)
    tl.store(ids_ptr + offs, ids, mask=mask)


class BlockCopyPlanner:
    def __init__(self, cfg: BeamConfig, backend: BeamDecodeBackend, kv_caches: List[torch.Tensor]):
        self.cfg = cfg
        self.backend = backend
        self.kv_caches = kv_caches
        self.device = backend.device
        self.copy_pairs = torch.zeros((cfg.max_copies_per_step, 2), dtype=torch.int64, device=self.device)
        self.pairs_cpu = torch.zeros((cfg.max_copies_per_step, 2), dtype=torch.int64, pin_memory=True)
        self.num_pairs = 0

    def plan_copies(self, copies: List[Tuple[int, int]]) -> int:
        n = len(copies)
        if n > self.pairs_cpu.shape[0]:
            self.pairs_cpu = torch.zeros((n, 2), dtype=torch.int64, pin_memory=True)  # ok: FC107
            self.copy_pairs = torch.zeros((n, 2), dtype=torch.int64, device=self.device)  # expect: FC107
        if n:
            self.pairs_cpu[:n] = torch.tensor(copies, dtype=torch.int64)
            self.copy_pairs[:n].copy_(self.pairs_cpu[:n], non_blocking=True)
        self.num_pairs = n
        return n

    def apply_copies(self, padded: Optional[int]) -> None:
        if self.num_pairs == 0:
            return
        # two beams forking the same shared tail in one step queue the same source twice
        pairs = torch.unique(self.copy_pairs[: self.num_pairs], dim=0)  # expect: FC101
        src, dst = pairs[:, 0].contiguous(), pairs[:, 1].contiguous()
        for cache in self.kv_caches:
            cache.index_copy_(0, dst, cache.index_select(0, src))
        if padded is None:
            return
        ids = self.backend.graph_bufs[padded]["indices"]
        n_ids = self.backend.planned_indices.get(padded, 0)
        grid = (triton.cdiv(max(n_ids, 1), 1024),)
        _remap_block_ids_kernel[grid](ids, n_ids, src, dst, pairs.shape[0], BLOCK=1024)  # expect: FC104
