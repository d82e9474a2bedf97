from dataclasses import dataclass
from typing import Tuple

import torch

# MiB per auxiliary workspace; the reference path only ever runs one request
WORKSPACE_MIB = {"reference": 128, "scratch": 64}


@dataclass
class InvariantConfig:
    num_layers: int = 16
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 32000
    intermediate_size: int = 8192
    page_size: int = 16
    max_batch: int = 64
    max_pages: int = 32768
    max_prefill_tokens: int = 4096
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    # one split size for every batch: the reduction order never depends on the batch
    fixed_split_pages: int = 64
    swa_every: int = 2
    sliding_window: int = 1024
    graph_workspace_bytes: int = 256 * 1024 * 1024
    dtype: torch.dtype = torch.bfloat16
    device: str = "cuda"

    @property
    def hidden_size(self) -> int:
        return self.num_qo_heads * self.head_dim

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2

    def swa_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * (self.sliding_window // self.page_size) * 64
