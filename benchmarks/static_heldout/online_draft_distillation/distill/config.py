"""Limits of the speculative server and of the online distillation of its draft."""
from dataclasses import dataclass
from typing import Tuple


@dataclass
class DistillConfig:
    max_batch: int = 32
    num_draft_tokens: int = 4
    draft_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    page_size: int = 16
    num_pages: int = 32768
    max_context: int = 8192
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    target_layers: int = 8
    draft_layers: int = 1
    vocab_size: int = 32000
    train_every: int = 64
    train_batch_tokens: int = 4096
    train_window: int = 256
    lr: float = 1e-4
    ring_tokens: int = 65536
    device: str = "cuda"

    @property
    def max_bucket(self) -> int:
        return max(self.draft_buckets)

    @property
    def pages_per_seq(self) -> int:
        return -(-self.max_context // self.page_size)

    def verify_workspace_bytes(self) -> int:
        rows = self.max_bucket * (self.num_draft_tokens + 1)
        return rows * self.num_qo_heads * self.head_dim * 4 * 16 + (8 << 20)

    def prompt_workspace_bytes(self) -> int:
        return self.max_context * self.num_qo_heads * self.head_dim * 4 + (16 << 20)

    def eager_decode_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * self.pages_per_seq * 128

    def train_workspace_bytes(self) -> int:
        return self.train_batch_tokens * self.num_qo_heads * self.head_dim * 4 + (8 << 20)
