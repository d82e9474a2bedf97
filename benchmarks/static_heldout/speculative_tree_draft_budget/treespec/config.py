"""Configuration of the target model, the draft model and the speculation budget."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

import torch

# Set by ``plan()`` on every FlashInfer wrapper; present once a wrapper has been planned.
PLAN_STATE_ATTR = "_plan_info"


@dataclass
class SpecConfig:
    hidden_size: int = 4096
    draft_hidden_size: int = 1024
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    draft_num_heads: int = 8
    vocab_size: int = 32000
    page_size: int = 16  # target pool; the draft pool holds one token per page
    num_target_pages: int = 8192
    num_draft_slots: int = 1 << 18
    max_batch: int = 64
    max_model_len: int = 8192
    max_depth: int = 6
    topk: int = 4
    step_token_budget: int = 256  # draft nodes per step over the whole batch
    max_nodes_per_request: int = 32
    min_nodes_per_request: int = 2
    draft_buckets: Tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    dtype: torch.dtype = torch.float16

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def max_draft_rows(self) -> int:
        return max(self.draft_buckets)

    def max_tree_nodes(self) -> int:
        return self.max_batch * (self.max_nodes_per_request + 1)

    def max_mask_bits(self) -> int:
        per_req = (self.max_nodes_per_request + 1) * (self.max_model_len + self.max_nodes_per_request + 1)
        return self.max_batch * per_req

    def draft_ws_bytes(self) -> int:
        chunks = max(1, self.max_model_len // 1024)
        return self.max_draft_rows * self.draft_num_heads * (self.head_dim + 1) * 4 * chunks + (8 << 20)

    def graph_ws_bytes(self) -> int:
        # graph-mode plans keep split-k partials for the largest bucket
        return self.draft_ws_bytes() + self.max_draft_rows * 4096
