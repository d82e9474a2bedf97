"""Request-to-token map, the paged KV pool and its defragmenter (SGLang's ReqToTokenPool / MHATokenToKVPool).

page_size is 1 here: a page is one token slot, and ``req_to_token[r, t]`` is the slot of token t of request r.
Slot 0 is the padding slot the CUDA-graph padding rows point at.
"""

from __future__ import annotations

import logging
from typing import List, Optional

import numpy as np
import torch

from tkv_kernels.index_kernels import remap_page_ids_

logger = logging.getLogger(__name__)


class ReqToTokenPool:
    def __init__(self, size: int, max_context_len: int, device: torch.device):
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
        # slot 0 is reserved for the padding rows of captured graphs
        self.free_slots: List[int] = list(range(1, size))

    def alloc(self, need_size: int) -> Optional[List[int]]:
        if need_size > len(self.free_slots):
            return None
        select, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return select

    def free(self, free_index: int) -> None:
        self.free_slots.append(free_index)

    def write(self, req_idx: int, start: int, locs: torch.Tensor) -> None:
        self.req_to_token[req_idx, start : start + locs.numel()] = locs.to(torch.int32)


class TokenToKVPool:
    """K and V buffers per layer, one row per token slot; the free list is kept on the host (numpy)."""

    def __init__(self, size: int, num_kv_heads: int, head_dim: int, num_layers: int, dtype: torch.dtype, device: torch.device):
        self.size = size
        self.device = device
        self.k_buffer = [
            torch.zeros((size + 1, num_kv_heads, head_dim), dtype=dtype, device=device) for _ in range(num_layers)
        ]
        self.v_buffer = [
            torch.zeros((size + 1, num_kv_heads, head_dim), dtype=dtype, device=device) for _ in range(num_layers)
        ]
        self.free_pages_np = np.arange(1, size + 1, dtype=np.int64)

    def available_size(self) -> int:
        return int(self.free_pages_np.shape[0])

    def alloc(self, need_size: int) -> torch.Tensor:
        assert need_size <= self.available_size(), "out of KV cache pages"  # expect: FC109
        select = self.free_pages_np[:need_size]
        self.free_pages_np = self.free_pages_np[need_size:]
        return torch.from_numpy(select).to(self.device, non_blocking=True)

    def free(self, pages: np.ndarray) -> None:
        self.free_pages_np = np.concatenate([self.free_pages_np, pages])

    def get_kv_buffer(self, layer_id: int):
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id][loc] = k.view(loc.numel(), *self.k_buffer[layer_id].shape[1:])
        self.v_buffer[layer_id][loc] = v.view(loc.numel(), *self.v_buffer[layer_id].shape[1:])

    def move_pages(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        for k, v in zip(self.k_buffer, self.v_buffer):
            k[dst] = k[src]
            v[dst] = v[src]


class KVDefragmenter:
    """Moves live pages to the front of the pool between steps and rewrites the page ids that point at them."""

    def __init__(self, kv_pool: TokenToKVPool, req_to_token_pool: ReqToTokenPool, block_size: Optional[int]):
        self.kv_pool = kv_pool
        self.req_to_token_pool = req_to_token_pool
        self.block_size = block_size
        self.stream = torch.cuda.Stream(device=kv_pool.device)

    def compact(self, remap: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """remap[p] is the new id of page p; src/dst list the pages that move."""
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            self.kv_pool.move_pages(src, dst)
            # the per-step planners rebuild kv_indices from req_to_token, so this is the only map to patch
            remap_page_ids_(self.req_to_token_pool.req_to_token, remap, self.block_size)  # ok: FC104
        torch.cuda.current_stream().wait_stream(self.stream)
        moved = int((remap != torch.arange(remap.numel(), device=remap.device)).sum())  # ok: FC101
        logger.info("kv defrag moved %d pages", moved)
