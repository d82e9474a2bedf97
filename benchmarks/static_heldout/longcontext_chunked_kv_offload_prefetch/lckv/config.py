from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class OffloadConfig:
    num_layers: int = 32
    layers_per_group: int = 4
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    intermediate_size: int = 14336
    page_size: int = 64
    chunk_tokens: int = 4096          # one summary page per chunk
    chunk_pages: int = 64
    host_pages: int = 262144          # 16M tokens of host KV
    window_slots: int = 8192          # device slots per layer
    grow_slots: int = 1024
    max_summary_pages: int = 16384
    window_pages_per_req: int = 512
    sink_pages: int = 4
    prefetch_groups_ahead: int = 2
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8)
    max_chunk_tokens: int = 8192
    log_every: int = 64
    dtype: torch.dtype = torch.bfloat16
    device: str = "cuda"

    @property
    def num_groups(self) -> int:
        return self.num_layers // self.layers_per_group

    @property
    def max_window_pages(self) -> int:
        return max(self.decode_buckets) * self.window_pages_per_req

    def decode_workspace_bytes(self) -> int:
        # trtllm-gen multi-CTA partials for the largest bucket and its counters
        return max(self.decode_buckets) * self.num_qo_heads * self.window_pages_per_req * 64 * 4

    def chunk_workspace_bytes(self) -> int:
        return self.max_chunk_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2
