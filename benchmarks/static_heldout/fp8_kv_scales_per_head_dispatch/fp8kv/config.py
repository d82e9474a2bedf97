"""Serving limits and the per-layer KV dtype policy."""

import enum
from dataclasses import dataclass
from typing import Tuple

import torch

FP8_E4M3_MAX = 448.0


class KVDtype(str, enum.Enum):
    FP8 = "fp8_e4m3"
    BF16 = "bf16"

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn if self is KVDtype.FP8 else torch.bfloat16


@dataclass
class Fp8ServeConfig:
    num_layers: int = 40
    num_qo_heads: int = 40
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 5120
    intermediate_size: int = 13824
    vocab_size: int = 152064
    rope_theta: float = 1000000.0
    page_size: int = 32
    num_pages: int = 40000
    max_batch_size: int = 256
    max_pages_per_seq: int = 1024
    chunked_prefill_size: int = 8192
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    # the first and last layers are the most sensitive to KV quantisation: keep them in bf16
    bf16_head_layers: int = 2
    bf16_tail_layers: int = 2
    amax_history_len: int = 16
    rescale_margin: float = 1.25
    long_context_threshold: int = 16384
    trtllm_workspace_bytes: int = 256 << 20
    split_kv_chunks: int = 32

    @property
    def gqa_group(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    def kv_dtype(self, layer: int) -> KVDtype:
        if layer < self.bf16_head_layers or layer >= self.num_layers - self.bf16_tail_layers:
            return KVDtype.BF16
        return KVDtype.FP8

    def decode_workspace_bytes(self) -> int:
        partials = self.max_batch_size * self.num_qo_heads * self.split_kv_chunks * (self.head_dim + 1) * 4
        return partials + (16 << 20)

    def prefill_workspace_bytes(self) -> int:
        tiles = self.chunked_prefill_size * self.num_qo_heads * (self.head_dim + 1) * 4 * 2
        return tiles + (32 << 20)
