"""Model shape, beam widths and workspace sizes."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List


class WsSize(enum.IntEnum):
    # prompt prefill and the shared-prompt attention of the beams
    PREFILL = 256 * 1024 * 1024


@dataclass
class BeamConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 32000
    page_size: int = 16
    num_pages: int = 65536
    beam_widths: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    graph_widths: List[int] = field(default_factory=lambda: [1, 2, 4, 8])
    max_requests: int = 32
    max_prompt_len: int = 4096
    max_new_tokens: int = 256
    length_penalty: float = 1.0
    eos_token_id: int = 2

    @property
    def max_rows(self) -> int:
        return self.max_requests * max(self.beam_widths)

    @property
    def pages_per_seq(self) -> int:
        return (self.max_prompt_len + self.max_new_tokens + self.page_size - 1) // self.page_size

    def graph_workspace_bytes(self) -> int:
        return self.max_rows * self.num_qo_heads * self.head_dim * 4 * 16

    def xqa_workspace_bytes(self) -> int:
        return self.max_rows * self.num_qo_heads * self.head_dim * 4 * 32 + (4 << 20)
