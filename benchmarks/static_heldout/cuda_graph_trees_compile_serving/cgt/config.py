from dataclasses import dataclass
from typing import Tuple

import torch

# global-layer wrapper workspace, sized once when the team benchmarked 32k contexts
EAGER_DECODE_WORKSPACE_BYTES = 256 * 1024 * 1024
DEFAULT_PAGE_SIZE = 16


@dataclass
class ServingConfig:
    vocab_size: int = 32000
    num_layers: int = 24
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 11008
    page_size: int = DEFAULT_PAGE_SIZE
    max_batch: int = 256
    max_pages: int = 65536
    max_seq_len: int = 32768
    max_prefill_tokens: int = 8192
    sliding_window: int = 4096
    global_layer_every: int = 6
    hand_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    compiled_buckets: Tuple[int, ...] = (64, 128, 256)
    dtype: torch.dtype = torch.bfloat16
    device: str = "cuda"

    @property
    def hidden_size(self) -> int:
        return self.num_qo_heads * self.head_dim

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    def graph_workspace_bytes(self) -> int:
        # split-k partial outputs and LSEs for the largest bucket, plus int metadata
        partials = self.max_batch * self.num_qo_heads * (self.head_dim + 1) * 4 * 16
        return partials + 8 * 1024 * 1024

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * self.max_pages_per_seq * 8

    def prefill_workspace_bytes(self, max_tokens: int) -> int:
        return max_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 4
