"""Model shape and engine limits."""
from __future__ import annotations

import dataclasses

import torch

# Workspace of the full-context decode wrapper, in MiB.  Measured once on an
# H100 with the 8B model at batch 64 and never revisited.
GLOBAL_DECODE_WS_MB = 96


@dataclasses.dataclass
class MistralRingConfig:
    num_layers: int = 36
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 131072
    hidden_size: int = 4096
    sliding_window: int = 4096
    page_size: int = 16
    # Ministral-style interleave: every `global_every`-th layer attends to the
    # whole context through an ordinary (non-ring) paged pool.
    global_every: int = 4
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    graph_buckets: tuple = (1, 2, 4, 8, 16, 32, 64, 128)
    dtype: torch.dtype = torch.bfloat16
    use_trtllm_gen: bool = False

    @property
    def ring_pages(self) -> int:
        # one spare page so the page being written never aliases the oldest live one
        return self.sliding_window // self.page_size + 1

    @property
    def max_context_pages(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size

    @property
    def max_graph_bs(self) -> int:
        return self.graph_buckets[-1]

    def is_global_layer(self, layer_id: int) -> bool:
        return (layer_id + 1) % self.global_every == 0
