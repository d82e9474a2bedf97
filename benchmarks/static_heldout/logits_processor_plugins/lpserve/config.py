"""Server configuration."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

import torch

# Prompt prefill workspace. Kept behind a callable so that a deployment can patch it before the
# attention backend is built (the prefill planner only ever saw 8k-token prompts in testing).
prefill_workspace_bytes = lambda: 256 << 20  # noqa: E731


@dataclass
class ServeConfig:
    vocab_size: int = 128256
    hidden_size: int = 4096
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch_size: int = 256
    max_pages: int = 131072
    max_context_len: int = 32768
    long_context_threshold: int = 8192
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    processors: List[str] = field(default_factory=lambda: ["repetition", "bad_words", "json_mode"])
    max_bad_words: int = 64
    repetition_window: int = 1024
    eos_token_id: int = 128009
    dtype: torch.dtype = torch.bfloat16

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs and LSEs for the largest bucket, plus the planner's int section
        chunks = max(1, self.max_context_len // 512)
        partial = max(self.graph_buckets) * self.num_qo_heads * chunks * (self.head_dim + 1) * 4
        return partial + (8 << 20)

    def eager_workspace_bytes(self) -> int:
        chunks = max(1, self.max_context_len // 512)
        return self.max_batch_size * self.num_qo_heads * chunks * (self.head_dim + 1) * 4 + (8 << 20)

    def long_context_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * (self.max_context_len // 256) * 4 + (32 << 20)

    @property
    def mask_words(self) -> int:
        return (self.vocab_size + 31) // 32
