"""InfLLM-style context block selection by representative keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class Selection:
    rows: List[List[int]]     # per request: host page ids attended this step (sink + blocks + window)
    num_pages_np: np.ndarray


class BlockSelector:
    def __init__(self, num_kv_heads: int, head_dim: int, pages_per_block: int, topk_blocks: int,
                 sink_pages: int, window_pages: int, max_blocks: int, device: torch.device):
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.pages_per_block = pages_per_block
        self.topk_blocks = topk_blocks
        self.sink_pages = sink_pages
        self.window_pages = window_pages
        self.max_blocks = max_blocks
        self.device = device
        self.rep_keys: Optional[torch.Tensor] = None
        self.block_scores = torch.zeros(1, max_blocks, device=device)

    def update_rep_keys(self, rid_slot: int, block: int, keys: torch.Tensor) -> None:
        if self.rep_keys is None:
            self.rep_keys = torch.zeros(  # ok: FC107
                256, self.max_blocks, self.num_kv_heads, self.head_dim, dtype=torch.bfloat16, device=self.device
            )
        # representative key: the block's keys with the largest norm, averaged over the top 4
        norms = keys.float().norm(dim=-1).mean(-1)
        top = norms.topk(min(4, norms.numel())).indices
        self.rep_keys[rid_slot, block] = keys[top].mean(0)

    def select(self, q: torch.Tensor, slots: List[int], req_pages: List[List[int]]) -> Selection:
        bs = len(slots)
        nb = self.max_blocks
        self.block_scores = torch.zeros(bs, nb, device=self.device)  # expect: FC107
        qh = q.view(bs, self.num_kv_heads, -1, self.head_dim).mean(2)
        reps = self.rep_keys[torch.as_tensor(slots, device=self.device)]
        self.block_scores.copy_(torch.einsum("bhd,bnhd->bn", qh.float(), reps.float()))
        k = min(self.topk_blocks, nb)
        chosen = self.block_scores.topk(k, dim=-1).indices.tolist()  # expect: FC101
        rows = []
        for pages, blocks in zip(req_pages, chosen):
            n = len(pages)
            sink = pages[: self.sink_pages]
            window = pages[max(self.sink_pages, n - self.window_pages):]
            mid = []
            for b in sorted(blocks):
                lo = self.sink_pages + b * self.pages_per_block
                hi = min(lo + self.pages_per_block, n - len(window))
                mid.extend(pages[lo:hi])
            rows.append(sink + mid + window)
        return Selection(rows=rows, num_pages_np=np.asarray([len(r) for r in rows], dtype=np.int32))
