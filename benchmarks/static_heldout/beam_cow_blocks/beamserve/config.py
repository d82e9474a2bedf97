from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class BeamConfig:
    num_layers: int = 28
    hidden_size: int = 3584
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 152064
    block_size: int = 16
    num_blocks: int = 32768
    max_beam_width: int = 8
    max_requests: int = 32
    max_blocks_per_beam: int = 512
    max_copies_per_step: int = 256
    graph_beam_buckets: Tuple[int, ...] = (4, 8, 16, 32, 64, 128)
    kv_layout: str = "NHD"
    dtype: torch.dtype = torch.bfloat16

    @property
    def max_beams_per_step(self) -> int:
        return self.max_requests * self.max_beam_width

    def workspace_bytes(self) -> int:
        # split-k partials for every beam row plus the prefix (cascade) pass over the same rows
        rows = 2 * self.max_beams_per_step
        return rows * self.num_qo_heads * (self.head_dim + 1) * 4 * 32 + (16 << 20)
