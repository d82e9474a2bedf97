from dataclasses import dataclass
from typing import Tuple


@dataclass
class TTSConfig:
    # text / semantic backbone
    text_layers: int = 24
    text_heads: int = 16
    text_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_streams: int = 64
    max_context: int = 4096
    num_pages: int = 32768
    # depth transformer: one short sequence of codebook tokens per audio frame
    depth_layers: int = 4
    depth_heads: int = 8
    depth_head_dim: int = 64
    num_codebooks: int = 8
    codebook_size: int = 2048
    frames_per_chunk: int = 6
    frame_rate_hz: float = 12.5
    eos_code: int = 2047
    stream_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)

    def text_workspace_bytes(self) -> int:
        return self.max_streams * self.text_heads * self.head_dim * 4 * 32
