from dataclasses import dataclass, field
from typing import Tuple

import torch


@dataclass
class ComponentConfig:
    """One decoder LM (the thinker or the talker)."""

    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    page_size: int = 16
    max_batch_size: int = 64
    max_seq_len: int = 32768
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    dtype: torch.dtype = torch.bfloat16

    @property
    def hidden_size(self) -> int:
        return self.num_qo_heads * self.head_dim

    @property
    def max_pages(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    def workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (16 << 20)


@dataclass
class EncoderConfig:
    num_layers: int
    num_heads: int
    head_dim: int
    max_tokens: int
    spatial_merge: int = 2

    def workspace_bytes(self) -> int:
        return self.max_tokens * self.num_heads * (self.head_dim + 1) * 4 * 4 + (8 << 20)


@dataclass
class OmniConfig:
    thinker: ComponentConfig = field(default_factory=lambda: ComponentConfig(28, 28, 4, 128, 152064))
    talker: ComponentConfig = field(default_factory=lambda: ComponentConfig(20, 16, 2, 64, 4096))
    audio: EncoderConfig = field(default_factory=lambda: EncoderConfig(32, 20, 64, 1500 * 32))
    vision: EncoderConfig = field(default_factory=lambda: EncoderConfig(32, 16, 80, 16384))
    audio_pad_id: int = 151646
    image_pad_id: int = 151655
    num_codebooks: int = 8
    stream_slots: int = 4
