"""Limits of the streaming video engine."""
from dataclasses import dataclass
from typing import Tuple

# MiB per FlashInfer workspace that is not sized from the limits below
WS_MIB = {"ingest": 256, "debug": 16}


@dataclass
class VideoStreamConfig:
    max_streams: int = 8
    max_frames: int = 512
    frame_buckets: Tuple[int, ...] = (1, 2, 4, 8)
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8)
    image_size: int = 336
    patch: int = 14
    tokens_per_frame: int = 64
    dup_threshold: float = 0.97
    min_frame_score: float = 1e-3
    visual_token_budget: int = 16384
    page_size: int = 16
    num_pages: int = 32768
    text_pages_per_stream: int = 128
    vision_hidden: int = 1024
    vision_heads: int = 16
    vision_layers: int = 4
    hidden_size: int = 2048
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    num_layers: int = 4
    vocab_size: int = 32000
    device: str = "cuda"

    @property
    def patches_per_frame(self) -> int:
        return (self.image_size // self.patch) ** 2

    @property
    def pages_per_frame(self) -> int:
        return self.tokens_per_frame // self.page_size

    @property
    def pages_per_stream(self) -> int:
        return self.max_frames * self.pages_per_frame + self.text_pages_per_stream

    def vision_workspace_bytes(self) -> int:
        rows = max(self.frame_buckets) * self.patches_per_frame
        return rows * self.vision_heads * (self.vision_hidden // self.vision_heads) * 4 + (8 << 20)

    def decode_workspace_bytes(self) -> int:
        return max(self.decode_buckets) * self.num_qo_heads * self.pages_per_stream * 64
