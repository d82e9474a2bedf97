from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class ServerConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    kv_layout: str = "HND"
    chunk_size: int = 2048
    max_prefill_tokens: int = 16384
    max_prompts_per_step: int = 512
    max_context_len: int = 32768
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    trtllm_threshold: int = 8192   # chunks with at least this many tokens use the trtllm-gen context kernel
    dtype: torch.dtype = torch.bfloat16

    @property
    def pages_per_request(self) -> int:
        return -(-self.max_context_len // self.page_size)

    @property
    def max_decode_batch(self) -> int:
        return max(self.decode_buckets)

    def prefix_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_heads * (self.head_dim + 1) * 4 * 2 + (32 << 20)

    def decode_workspace_bytes(self) -> int:
        splits = max(1, self.max_context_len // 1024)
        return self.max_decode_batch * self.num_heads * (self.head_dim + 1) * 4 * splits + (8 << 20)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_heads * 8 + (64 << 20)
