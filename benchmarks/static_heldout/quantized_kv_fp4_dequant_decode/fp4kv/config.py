from dataclasses import dataclass

import torch

from .constants import DEFAULT_BUCKETS


@dataclass
class FP4Config:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 128
    num_pages: int = 131072
    max_pages_per_seq: int = 512
    max_prefill_tokens: int = 16384
    buckets: tuple = DEFAULT_BUCKETS
    dtype: torch.dtype = torch.bfloat16
    overflow_budget: int = 256
    native_fp4: bool = False

    @property
    def max_graph_bs(self) -> int:
        return max(self.buckets)

    def staging_pages(self, batch: int) -> int:
        """bf16 pages the dequant staging area needs for `batch` full-length rows."""
        return batch * self.max_pages_per_seq

    def graph_workspace_bytes(self) -> int:
        # split-k partial outputs: one fp32 [heads, head_dim] row plus its lse per chunk
        chunks = 64
        per_row = self.num_qo_heads * (self.head_dim + 1) * 4
        return self.max_graph_bs * chunks * per_row + (8 << 20)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * 32 * (self.head_dim + 2) * 4 + (16 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2 + (32 << 20)
