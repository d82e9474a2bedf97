from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Tuple


def depth_workspace_bytes() -> int:
    """Scratch for the depth transformer's per-codebook decode (operators can raise it for big buckets)."""
    return int(os.environ.get("DUPLEX_DEPTH_WORKSPACE_MB", "64")) << 20


@dataclass(frozen=True)
class DuplexSettings:
    num_codebooks: int = 8
    acoustic_delay: int = 2            # codebooks 1.. lag the semantic codebook by this many frames
    max_sessions: int = 64
    context_frames: int = 3000         # temporal attention window, 4 minutes of audio
    page_size: int = 16
    temporal_layers: int = 32
    temporal_hidden: int = 4096
    temporal_heads: int = 32
    temporal_kv_heads: int = 8
    head_dim: int = 128
    depth_layers: int = 6
    depth_hidden: int = 1024
    depth_heads: int = 16
    depth_head_dim: int = 64
    depth_page: int = 16               # one page holds a frame's codebook positions
    text_vocab: int = 32000
    audio_vocab: int = 2048
    text_pad: int = 3
    audio_pad: int = 2048
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)
    frame_rate: float = 12.5
    sample_rate: int = 24000

    @property
    def pages_per_session(self) -> int:
        return -(-self.context_frames // self.page_size)

    @property
    def samples_per_frame(self) -> int:
        return int(self.sample_rate / self.frame_rate)

    def temporal_workspace_bytes(self) -> int:
        per_row = self.temporal_heads * (self.head_dim + 1) * 4 * 16
        return max(32 << 20, self.max_sessions * per_row)
