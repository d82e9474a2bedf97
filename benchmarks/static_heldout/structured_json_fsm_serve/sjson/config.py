"""Limits of the structured-output server.

Decode graphs are captured for a fixed set of batch buckets; JSON-schema masks are compiled on the host once per schema
and copied to the device as packed 32-bit words every step.
"""
from dataclasses import dataclass
from typing import Tuple

# Sized once for the largest decode bucket on an H100 with 4k contexts and never revisited.
DECODE_WORKSPACE_BYTES = 96 * 1024 * 1024


@dataclass(frozen=True)
class ServerConfig:
    model_path: str = ""
    num_layers: int = 32
    max_batch_size: int = 64
    max_seq_len: int = 8192
    page_size: int = 16
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    vocab_size: int = 128256
    eos_token_id: int = 128001
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    max_jump_forward: int = 32
    max_prefill_tokens: int = 16384
    max_schema_depth: int = 48
    use_trtllm_decode: bool = False

    @property
    def max_pages(self) -> int:
        per_req = (self.max_seq_len + self.page_size - 1) // self.page_size
        return self.max_batch_size * per_req + 1

    @property
    def mask_words(self) -> int:
        return (self.vocab_size + 31) // 32

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs per (request, head, 1k chunk) plus the planner's own scratch
        chunks = (self.max_seq_len + 1023) // 1024
        partials = self.max_batch_size * self.num_qo_heads * chunks * (self.head_dim + 2) * 4
        return partials + (8 << 20)

    def extend_workspace_bytes(self) -> int:
        per_token = self.num_qo_heads * (self.head_dim + 1) * 4
        return max(32 << 20, self.max_prefill_tokens * per_token * 2)
