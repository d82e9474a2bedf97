"""This rank's KV: a paged pool for its prompt shard, and a paged pool for the tail.

Generated tokens are computed identically on every rank, so their KV (the *tail*)
is replicated; only prompt KV is split over ranks.  The page tables live on the
host and are shipped to the device per step.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch


class ShardKVPool:
    def __init__(self, num_layers: int, shard_pages: int, tail_pages: int, page_size: int, num_kv_heads: int,
                 head_dim: int, max_reqs: int, max_pages_per_req: int, device: torch.device,
                 dtype: torch.dtype = torch.bfloat16):
        self.page_size = page_size
        self.device = device
        shape = (2, page_size, num_kv_heads, head_dim)
        self.shard_kv = [torch.zeros((shard_pages, *shape), dtype=dtype, device=device) for _ in range(num_layers)]
        self.tail_kv = [torch.zeros((tail_pages, *shape), dtype=dtype, device=device) for _ in range(num_layers)]
        self.req_to_shard_pages = np.zeros((max_reqs, max_pages_per_req), dtype=np.int32)
        self.req_to_tail_pages = np.zeros((max_reqs, max_pages_per_req), dtype=np.int32)
        self.shard_tokens = np.zeros(max_reqs, dtype=np.int64)
        self.prompt_lens = np.zeros(max_reqs, dtype=np.int64)
        self.free_shard: List[int] = list(range(shard_pages))
        self.free_tail: List[int] = list(range(tail_pages))

    def alloc_prompt(self, req: int, prompt_len: int, local_tokens: int) -> np.ndarray:
        pages = -(-local_tokens // self.page_size)
        ids = [self.free_shard.pop() for _ in range(pages)]
        self.req_to_shard_pages[req, :pages] = ids
        self.shard_tokens[req] = local_tokens
        self.prompt_lens[req] = prompt_len
        slots = np.asarray(ids, dtype=np.int64)[:, None] * self.page_size + np.arange(self.page_size)
        return slots.reshape(-1)[:local_tokens]

    def alloc_tail_slot(self, req: int, seq_len: int) -> int:
        """Slot of the token at position seq_len - 1, in the tail pool."""
        t = seq_len - 1 - int(self.prompt_lens[req])
        page, off = divmod(t, self.page_size)
        if off == 0:
            self.req_to_tail_pages[req, page] = self.free_tail.pop()
        return int(self.req_to_tail_pages[req, page]) * self.page_size + off

    def shard_table(self, reqs: List[int]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        P = self.page_size
        tokens = self.shard_tokens[reqs]
        pages = -(-tokens // P)
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        indices = np.concatenate([self.req_to_shard_pages[r, :p] for r, p in zip(reqs, pages)])
        last = ((tokens - 1) % P + 1).astype(np.int32)
        return torch.from_numpy(indptr), torch.from_numpy(indices).to(self.device, non_blocking=True), torch.from_numpy(last)

    def tail_table(self, reqs: List[int], seq_lens_cpu: torch.Tensor,
                   pad_to: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        P = self.page_size
        tokens = seq_lens_cpu.numpy().astype(np.int64) - self.prompt_lens[reqs]
        pages = -(-tokens // P)
        counts = list(pages)
        last = list(((tokens - 1) % P + 1).astype(np.int32))
        indices = [self.req_to_tail_pages[r, :p] for r, p in zip(reqs, pages)]
        if pad_to is not None:  # padded graph rows: one token on tail page 0
            extra = pad_to - len(reqs)
            counts += [1] * extra
            last += [1] * extra
            indices += [np.zeros(1, dtype=np.int32)] * extra
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        return (
            torch.from_numpy(indptr),
            torch.from_numpy(np.concatenate(indices)).to(self.device, non_blocking=True),
            torch.tensor(last, dtype=torch.int32),
        )
