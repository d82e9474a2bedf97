from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Tuple

import torch

# ViT ragged attention scratch; operators override it per deployment
VIT_WORKSPACE_MB = int(os.environ.get("PVLM_VIT_WORKSPACE_MB", "256"))


@dataclass
class VLMConfig:
    hidden_size: int = 3584
    num_layers: int = 28
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 152064
    rope_theta: float = 1000000.0
    mrope_section: Tuple[int, int, int] = (16, 24, 24)
    image_token_id: int = 151655
    vision_hidden: int = 1280
    vision_heads: int = 16
    vision_layers: int = 32
    patch_size: int = 14
    temporal_patch: int = 2
    spatial_merge_size: int = 2
    max_image_tokens: int = 4096
    image_cache_images: int = 64
    page_size: int = 16
    num_pages: int = 32768
    num_image_pages: int = 8192
    max_num_seqs: int = 64
    max_prefill_tokens: int = 16384
    max_model_len: int = 32768
    trtllm_ctx_threshold: int = 8192
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    dtype: torch.dtype = torch.bfloat16

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_model_len + self.page_size - 1) // self.page_size

    def decode_workspace_bytes(self) -> int:
        return self.max_num_seqs * self.num_qo_heads * (self.head_dim + 1) * 4 * 32 + (16 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2 + (32 << 20)

    def ctx_workspace_bytes(self) -> int:
        return self.max_num_seqs * self.num_qo_heads * 8192 + (64 << 20)
