"""Rollout engine configuration (shared by the trainer-side launcher)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

# Prompt prefill of a rollout batch: FA2 prefill scratch was ~180 MiB for 2k-token prompts at 256 requests.
PREFILL_WORKSPACE_MB = 256

# The trainer streams resharded weights in buckets of this size (flattened, 512-byte aligned views).
WEIGHT_BUCKET_BYTES = 512 << 20
assert WEIGHT_BUCKET_BYTES % 512 == 0, "weight buckets must stay 512-byte aligned"  # ok: FC109


@dataclass
class RolloutConfig:
    num_layers: int = 28
    hidden_size: int = 3584
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 152064
    page_size: int = 16
    num_pages: int = 32768
    max_running: int = 256
    max_prompt_len: int = 2048
    max_response_len: int = 4096
    capture_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    # multi-turn rollouts append short tool responses; those extends get their own graphs
    tool_extend_tokens: int = 8
    workspace_bytes: int = 384 << 20
    eos_token_id: int = 151645
    temperature: float = 1.0
    sm_version: int = 90

    @property
    def max_pages_per_req(self) -> int:
        return math.ceil((self.max_prompt_len + self.max_response_len) / self.page_size)

    def bucket(self, bs: int) -> int:
        return next(b for b in self.capture_bs if b >= bs)
