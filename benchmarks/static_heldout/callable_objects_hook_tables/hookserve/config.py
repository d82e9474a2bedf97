"""Limits and workspace sizes of the hook-table engine."""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Tuple

DECODE_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
assert all(b > 0 for b in DECODE_BUCKETS), "decode buckets must be positive"  # ok: FC109

PREFILL_WS_BYTES = 384 << 20  # ragged prefill scratch, measured on the launch mix
GRAPH_WS_MB = int(os.getenv("HOOKSERVE_GRAPH_WS_MB") or 128)
FIXED_WS_BYTES = {"window": lambda: 96 << 20, "cascade": lambda: 48 << 20}  # looked up as FIXED_WS_BYTES[kind]()


class WsSize(enum.IntEnum):
    SOFTCAP = 32 << 20


@dataclass(frozen=True)
class ServeConfig:
    hidden: int = 4096
    vocab_size: int = 151936
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch_size: int = 256
    max_num_tokens: int = 16384
    max_seq_len: int = 65536
    num_lora_slots: int = 8
    num_draft_tokens: int = 3
    sliding_window: int = 8192
    logits_soft_cap: float = 50.0
    extend_workspace_bytes: int = 256 << 20
    decode_buckets: Tuple[int, ...] = DECODE_BUCKETS
    layer_kinds: Tuple[str, ...] = ("full", "window", "softcap", "local", "trtllm", "full")

    @property
    def max_pages(self) -> int:
        return self.max_batch_size * (self.max_seq_len // self.page_size)

    def plan_dims(self) -> Tuple[int, int, int, int]:
        return self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size

    def split_kv_workspace_bytes(self) -> int:  # split-k partials (fp32 + lse) of the largest step
        return max(self.max_num_tokens, self.max_batch_size * 64) * self.num_qo_heads * (self.head_dim + 1) * 4
