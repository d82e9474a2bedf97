"""Paged KV cache shared by the target model and the EAGLE3 draft layers (draft layers are appended after the
target's layers, so both use the same page ids)."""
from __future__ import annotations

from collections import deque
from typing import Dict, List, Sequence

import torch


class KVCacheManager:
    def __init__(
        self,
        num_target_layers: int,
        num_draft_layers: int,
        num_kv_heads: int,
        head_dim: int,
        tokens_per_block: int,
        max_num_blocks: int,
        device: torch.device,
    ):
        self.num_target_layers = num_target_layers
        self.num_layers = num_target_layers + num_draft_layers
        self.tokens_per_block = tokens_per_block
        self.kv_cache_pool = torch.zeros(
            (self.num_layers, max_num_blocks, 2, num_kv_heads, tokens_per_block, head_dim), dtype=torch.bfloat16, device=device
        )
        self.free_blocks = deque(range(max_num_blocks))
        self.block_ids: Dict[int, List[int]] = {}
        self.num_tokens: Dict[int, int] = {}

    def layer_index(self, layer_idx: int, is_draft: bool) -> int:
        return self.num_target_layers + layer_idx if is_draft else layer_idx

    def get_buffers(self, pool_layer: int) -> torch.Tensor:
        return self.kv_cache_pool[pool_layer]

    def add_tokens(self, request_id: int, num_tokens: int) -> None:
        n = self.num_tokens.get(request_id, 0) + num_tokens
        blocks = self.block_ids.setdefault(request_id, [])
        while len(blocks) * self.tokens_per_block < n:
            blocks.append(self.free_blocks.popleft())
        self.num_tokens[request_id] = n

    def rewind_kv_cache(self, request_id: int, num_rejected: int) -> None:
        self.num_tokens[request_id] -= num_rejected
        keep = -(-self.num_tokens[request_id] // self.tokens_per_block)
        blocks = self.block_ids[request_id]
        self.free_blocks.extend(blocks[keep:])
        del blocks[keep:]

    def get_batch_cache_indices(self, request_ids: Sequence[int]) -> List[List[int]]:
        return [self.block_ids[r] for r in request_ids]
