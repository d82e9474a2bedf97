"""Engine limits of the VLM server (language model + vision tower)."""

from dataclasses import dataclass, field
from typing import List

import torch

# Attention scratch of the vision tower. The largest image bucket bounds the
# patches per replay, so one slab "should be enough" for every bucket.
VISION_WS_BYTES = 96 * 1024 * 1024


@dataclass
class VLMConfig:
    vocab_size: int = 151_936
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_layers: int = 4
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 64
    max_pages: int = 32_768
    max_prefill_tokens: int = 8192
    decode_buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    image_buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8])
    patches_per_image: int = 1024  # before the 2x2 merge
    patch_dim: int = 1176
    vision_hidden: int = 1024
    vision_heads: int = 16
    vision_layers: int = 2
    image_token_id: int = 151_655
    trtllm_workspace_bytes: int = 128 * 1024 * 1024
    device: torch.device = field(default_factory=lambda: torch.device("cuda", 0))

    @property
    def merged_tokens_per_image(self) -> int:
        return self.patches_per_image // 4

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32 o + lse) for the largest bucket, 32 chunks
        rows = self.decode_buckets[-1] * self.num_qo_heads
        return rows * (self.head_dim + 1) * 4 * 32 + (8 << 20)

    def prefill_workspace_bytes(self) -> int:
        rows = self.max_prefill_tokens * self.num_qo_heads
        return rows * (self.head_dim + 1) * 4 * 2 + (16 << 20)

    def prefill_pages(self) -> int:
        return self.max_prefill_tokens // self.page_size + self.max_batch
