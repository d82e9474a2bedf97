"""Limits of the soft-prompt server."""

from dataclasses import dataclass
from enum import IntEnum
from typing import Tuple

# The adapter loader stages uploads through this field of the ragged prefill wrapper.
FLOAT_WS_FIELD = "_float_workspace_buffer"


class WsTier(IntEnum):
    """Workspace tiers picked by hand for the first deployment."""

    SMALL = 32 * 1024 * 1024
    LARGE = 256 * 1024 * 1024


@dataclass
class SoftPromptConfig:
    vocab_size: int = 128256
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 65536
    max_batch_size: int = 64
    max_context: int = 32768
    max_num_tokens: int = 8192
    max_adapters: int = 32
    max_adapter_ids: int = 4096
    max_virtual_tokens: int = 64
    grow_slots_by: int = 8
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    prefill_token_buckets: Tuple[int, ...] = (128, 256, 512, 1024)
    long_prompt_threshold: int = 4096
    sm_version: int = 90
    device: str = "cuda"

    def max_pages_per_seq(self) -> int:
        return (self.max_context + self.page_size - 1) // self.page_size

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs and LSEs: up to 16 chunks per row
        return self.max_batch_size * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (8 << 20)

    def long_prefill_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 + (16 << 20)

    def bucket_for(self, bs: int) -> int:
        for b in self.decode_buckets:
            if b >= bs:
                return b
        return -1

    def prefill_bucket_for(self, num_tokens: int) -> int:
        for n in self.prefill_token_buckets:
            if n >= num_tokens:
                return n
        return -1
