"""Engine limits and workspace sizes for the scoped decode engine."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Tuple

PAGE_SIZE = 16
GRAPH_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)
STEP_KINDS = ("decode", "extend", "draft", "eager")

assert GRAPH_BUCKETS == tuple(sorted(GRAPH_BUCKETS)), "graph buckets must ascend"  # ok: FC109

WINDOW_WORKSPACE_BYTES = 96 * 1024 * 1024  # sliding-window decode scratch, measured on the launch mix
LOCAL_WORKSPACE_MB = int(os.environ.get("SCOPES_LOCAL_WORKSPACE_MB", "64"))  # chunked-local scratch


def softcap_workspace_bytes() -> int:  # soft-capped decode scratch (Gemma-style layers)
    return 32 << 20


@dataclass(frozen=True)
class EngineConfig:
    num_layers: int = 10
    hidden: int = 4096
    vocab_size: int = 128256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = PAGE_SIZE
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_seq_len: int = 32768
    sliding_window: int = 4096
    logits_soft_cap: float = 30.0
    prefill_workspace_bytes: int = 256 * 1024 * 1024
    graph_buckets: Tuple[int, ...] = GRAPH_BUCKETS
    layer_kinds: Tuple[str, ...] = ("full", "window", "softcap", "local", "trtllm")

    def plan_dims(self) -> Tuple[int, int, int, int]:
        return self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size

    @property
    def max_pages(self) -> int:
        return self.max_batch_size * (self.max_seq_len // self.page_size)

    def split_kv_workspace_bytes(self) -> int:  # split-k partials (fp32 + lse) of the largest step
        rows = max(self.max_num_tokens, self.max_batch_size * 64)
        return rows * self.num_qo_heads * (self.head_dim + 1) * 4 + (16 << 20)
