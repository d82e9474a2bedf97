from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class ServerConfig:
    num_layers: int = 28
    num_qo_heads: int = 24
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 3072
    vocab_size: int = 151936
    page_size: int = 16
    num_pages: int = 65536
    max_batch_size: int = 128
    max_pages_per_seq: int = 1024
    max_prefill_tokens: int = 16384
    # prompt cache: embeddings and layer-0 KV of frequent prompts, kept on the device
    cache_slots: int = 512
    max_cached_prompt_len: int = 2048
    prefill_backend: str = "fa2"
    ctx_workspace_bytes: int = 512 << 20
    graph_buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])

    @property
    def pages_per_cached_prompt(self) -> int:
        return (self.max_cached_prompt_len + self.page_size - 1) // self.page_size
