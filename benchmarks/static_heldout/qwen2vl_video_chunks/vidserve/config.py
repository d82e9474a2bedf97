from dataclasses import dataclass

# ViT attention over one chunk of frames; 256 MiB was enough for 448x448 frames in the launch benchmark.
VISION_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass
class VideoEngineConfig:
    max_batch: int = 64
    max_num_tokens: int = 32768
    decode_buckets: tuple = (1, 2, 4, 8, 16, 32, 64)
    num_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    max_pages: int = 65536
    vit_heads: int = 16
    vit_head_dim: int = 80
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    frames_per_chunk: int = 16
    tokens_per_second: int = 2
    sm_version: int = 90
