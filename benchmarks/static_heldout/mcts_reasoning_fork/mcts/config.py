from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


@dataclass
class SearchConfig:
    num_pages: int = 65536
    page_size: int = 16
    max_seq_len: int = 16384
    num_layers: int = 28
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 151936
    expansion_widths: Tuple[int, ...] = (1, 4, 8, 16, 32)
    children_per_leaf: int = 4
    tokens_per_expansion: int = 16
    max_extend_tokens: int = 4096
    c_puct: float = 1.25
    solve_threshold: float = 0.97
    eos_id: int = 151643
    sm_major: int = 9
    device: str = "cuda"
    use_cuda_graph: bool = True

    @property
    def max_width(self) -> int:
        return max(self.expansion_widths)

    @property
    def max_pages_per_row(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    def decode_ws_bytes(self) -> int:
        chunks = 16
        return self.max_width * self.num_qo_heads * chunks * (self.head_dim + 1) * 4 + (self.max_width + 1) * 1024
