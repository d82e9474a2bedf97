"""Builder configuration and the sizes the builders share."""
from __future__ import annotations

import dataclasses
import enum
from typing import Tuple

PAGE_SIZE = 16
GRAPH_BATCH_SIZES: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64)
# name of the record FlashInfer keeps of its last plan, read by the plan-cache debug view
PLAN_INFO_ATTR = "_plan_info"
# MiB per auxiliary wrapper, from the profiling run on H100
_WS_MIB = {"ragged": 96, "tensor_core": 160}


class WsTier(enum.IntEnum):
    WINDOW = 64 * 1024 * 1024
    SPILL = 32 * 1024 * 1024


@dataclasses.dataclass
class BuilderConfig:
    attn_type: str = "paged"
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = PAGE_SIZE
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_model_len: int = 32768
    sliding_window: int = 4096
    global_tokens: int = 0
    tensor_core_min_bs: int = 32
    graph_batch_sizes: Tuple[int, ...] = GRAPH_BATCH_SIZES
    prefill_workspace_bytes: int = 256 * 1024 * 1024
    vocab_size: int = 128256

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_model_len + self.page_size - 1) // self.page_size

    @property
    def dims(self) -> Tuple[int, int, int, int]:
        return self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size

    def workspace_bytes(self) -> int:
        # split-k partials: fp32 per (token, head, head_dim) plus the planner's index arrays
        return self.max_num_tokens * self.num_qo_heads * self.head_dim * 4 + (16 << 20)
