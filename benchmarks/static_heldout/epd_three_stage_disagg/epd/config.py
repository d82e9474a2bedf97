"""Limits shared by the three stages."""

from dataclasses import dataclass
from typing import Tuple


@dataclass
class EPDConfig:
    vocab_size: int = 152064
    hidden_size: int = 3584
    intermediate_size: int = 18944
    vision_hidden: int = 1280
    vision_heads: int = 16
    vision_layers: int = 32
    patch_size: int = 14
    spatial_merge: int = 2
    image_token_id: int = 151655
    video_token_id: int = 151656
    max_images_per_batch: int = 16
    max_patches_per_batch: int = 65536
    encoder_chunk_patches: int = 16384
    embed_cache_rows: int = 262144
    num_layers: int = 28
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 131072
    max_batch_size: int = 128
    max_context: int = 32768
    max_num_tokens: int = 16384
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    long_context: int = 16384
    decode_graph_workspace_bytes: int = 128 * 1024 * 1024
    device: str = "cuda"

    def max_pages_per_seq(self) -> int:
        return (self.max_context + self.page_size - 1) // self.page_size

    def prefill_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 + (32 << 20)

    def long_decode_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * self.head_dim * 4 * 32 + (16 << 20)

    def staging_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * (self.head_dim + 1) * 4 * 8 + (4 << 20)

    def merged_rows(self, patches: int) -> int:
        return patches // (self.spatial_merge * self.spatial_merge)
