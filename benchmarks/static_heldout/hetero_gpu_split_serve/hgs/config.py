from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

PAGE_SIZE = 16


@dataclass
class ModelDims:
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    dtype: torch.dtype = torch.bfloat16


@dataclass
class ClusterConfig:
    decode_device: str = "cuda:0"  # B200: decode, graphs, trtllm-gen
    prefill_device: str = "cuda:1"  # L40S: chunked prefill
    decode_backend: str = "trtllm-gen"
    page_size: int = PAGE_SIZE
    decode_pages: int = 262144
    prefill_pages: int = 32768
    max_decode_seqs: int = 512
    max_prefill_seqs: int = 16
    chunk_size: int = 2048
    max_model_len: int = 32768
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    enable_graphs: bool = True

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_model_len + self.page_size - 1) // self.page_size

    def decode_workspace_bytes(self, dims: ModelDims) -> int:
        return self.max_decode_seqs * dims.num_qo_heads * 2048 + (32 << 20)

    def graph_workspace_bytes(self, dims: ModelDims) -> int:
        return max(self.decode_buckets) * dims.num_qo_heads * (dims.head_dim + 1) * 4 * 16 + (16 << 20)

    def prefill_workspace_bytes(self, dims: ModelDims) -> int:
        return self.max_prefill_seqs * self.chunk_size * dims.num_qo_heads * (dims.head_dim + 1) * 4 // 4 + (32 << 20)

    def prefill_scratch_bytes(self, dims: ModelDims) -> int:
        return self.chunk_size * dims.num_qo_heads * (dims.head_dim + 1) * 4 * 2 + (8 << 20)
