"""Engine configuration and module-level limits."""

from __future__ import annotations

import dataclasses

import torch

PAGE_SIZE = 16
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
EOS_TOKEN_ID = 2

# The sliding-window layers share one eager wrapper; its split-k scratch was sized once from a profile.
WINDOW_WORKSPACE_BYTES = 64 * 1024 * 1024

assert all(a < b for a, b in zip(GRAPH_BUCKETS, GRAPH_BUCKETS[1:])), "GRAPH_BUCKETS must increase"  # ok: FC109


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    vocab_size: int = 32000
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_layers: int = 16
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    rope_theta: float = 10000.0
    page_size: int = PAGE_SIZE
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_seq_len: int = 8192
    # every `window_every`-th layer attends only to the last `window_left + 1` tokens
    window_left: int = 4095
    window_every: int = 4
    kv_layout: str = "NHD"
    use_trtllm_decode: bool = False
    compact_every: int = 512
    dtype: torch.dtype = torch.bfloat16

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    @property
    def max_total_pages(self) -> int:
        return self.max_batch_size * self.max_pages_per_seq

    @property
    def q_size(self) -> int:
        return self.num_qo_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def graph_buckets(self) -> tuple[int, ...]:
        return tuple(b for b in GRAPH_BUCKETS if b <= self.max_batch_size)

    def is_window_layer(self, layer_id: int) -> bool:
        return self.window_left >= 0 and layer_id % self.window_every == self.window_every - 1

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32 o + lse per head) for the largest batch, up to 64 chunks a request
        chunks = min(self.max_pages_per_seq, 64)
        per_row = self.num_qo_heads * (self.head_dim + 1) * 4
        return self.max_batch_size * chunks * per_row + (16 << 20)

    def prefill_workspace_bytes(self) -> int:
        per_token = self.num_qo_heads * (self.head_dim + 1) * 4
        return 2 * self.max_num_tokens * per_token + (32 << 20)

    def trtllm_workspace_bytes(self) -> int:
        # multi-CTA partial results and the semaphores the kernel counts on
        return self.max_batch_size * self.num_qo_heads * self.head_dim * 4 * 16 + (8 << 20)
