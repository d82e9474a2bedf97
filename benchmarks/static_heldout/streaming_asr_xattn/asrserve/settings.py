"""Limits of the streaming recognizer: 10 ms mel hop, 40 ms encoder chunks, 4x subsampling."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class ASRSettings:
    sample_rate: int = 16000
    hop_ms: int = 10
    chunk_ms: int = 40
    subsampling: int = 4
    n_mels: int = 80
    enc_layers: int = 12
    enc_dim: int = 512
    enc_heads: int = 8
    left_context_frames: int = 64
    dec_layers: int = 6
    dec_dim: int = 512
    dec_heads: int = 8
    head_dim: int = 64
    vocab_size: int = 5000
    page_size: int = 16
    enc_page_size: int = 16
    max_streams: int = 256
    max_decode_len: int = 448
    max_audio_s: int = 600
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    blank_id: int = 0
    eos_id: int = 2

    def enc_frames_per_chunk(self) -> int:
        return self.chunk_ms // (self.hop_ms * self.subsampling)

    def max_enc_frames(self) -> int:
        return self.max_audio_s * 1000 // (self.hop_ms * self.subsampling)

    def max_enc_pages_per_stream(self) -> int:
        return math.ceil(self.max_enc_frames() / self.enc_page_size)

    def max_self_pages_per_stream(self) -> int:
        return math.ceil(self.max_decode_len / self.page_size)

    def self_workspace_bytes(self) -> int:
        # split-kv partial outputs of the decoder's self-attention for a full batch, fp32 + lse
        return self.max_streams * self.dec_heads * (self.head_dim + 1) * 4 * 16

    def encoder_workspace_bytes(self) -> int:
        rows = self.max_streams * (self.left_context_frames + self.enc_frames_per_chunk())
        return max(16 << 20, rows * self.enc_heads * (self.enc_dim // self.enc_heads + 1) * 4)
