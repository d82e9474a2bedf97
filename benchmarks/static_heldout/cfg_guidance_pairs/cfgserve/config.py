from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    num_layers: int = 24
    hidden_size: int = 2048
    num_heads: int = 16
    num_kv_heads: int = 16
    head_dim: int = 128
    text_vocab_size: int = 102400
    image_vocab_size: int = 16384
    rope_theta: float = 10000.0


@dataclass
class GenConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    image_tokens: int = 576  # a 24 x 24 grid of VQ codes
    page_size: int = 16
    num_pages: int = 32768
    max_pairs: int = 64
    max_prompt_len: int = 1024
    # pair buckets recorded as decode graphs (each bucket holds 2 * bs rows)
    graph_pairs: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 24, 32, 48, 64])
    default_guidance: float = 5.0
    guidance_schedule: str = "linear"
    top_k: int = 4096
    device: str = "cuda"

    @property
    def max_pages_per_row(self) -> int:
        return (self.max_prompt_len + self.image_tokens + self.page_size - 1) // self.page_size
