"""Limits of the offline server."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class OfflineConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    page_size: int = 16
    batch_rows: int = 512
    padded_lengths: List[int] = field(default_factory=lambda: [128, 256, 512, 1024, 2048])
    max_prompt_len: int = 8192
    max_new_tokens: int = 256
    refill_len: int = 64
    refill_rows: int = 32
    max_job_requests: int = 50000
    kv_dtype: str = "bf16"  # or "fp8" (XQA decode)
    prefill_backend: str = "fa2"
    result_dir: str = "/var/lib/bapi/results"

    @property
    def pages_per_row(self) -> int:
        return (max(self.max_prompt_len, max(self.padded_lengths)) + self.max_new_tokens + self.page_size - 1) // self.page_size

    def graph_workspace_bytes(self) -> int:
        return self.batch_rows * max(self.padded_lengths) * self.num_qo_heads * self.head_dim * 4

    def decode_workspace_bytes(self) -> int:
        return self.batch_rows * self.num_qo_heads * self.head_dim * 4 * 32 + (8 << 20)
