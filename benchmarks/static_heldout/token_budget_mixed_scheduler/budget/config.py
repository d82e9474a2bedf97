"""Limits of the mixed-batch server."""

from dataclasses import dataclass
from enum import Enum
from typing import Tuple


class WsClass(Enum):
    """Workspace classes in MiB, chosen when the server only ran 4k prompts."""

    STANDARD = 128
    LARGE = 384

    def nbytes(self) -> int:
        return self.value * 1024 * 1024


@dataclass
class BudgetConfig:
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 65536
    token_budget: int = 2048
    max_num_seqs: int = 256
    chunk_size: int = 512
    max_context: int = 32768
    window: int = 4096
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    use_trtllm_context: bool = False
    device: str = "cuda"

    def max_pages_per_seq(self) -> int:
        return (self.max_context + self.page_size - 1) // self.page_size

    def decode_workspace_bytes(self) -> int:
        return self.max_num_seqs * self.num_qo_heads * (self.head_dim + 1) * 4 * 8 + (16 << 20)

    def window_workspace_bytes(self) -> int:
        return self.max_num_seqs * self.num_qo_heads * (self.head_dim + 1) * 4 * 4 + (8 << 20)

    def context_workspace_bytes(self) -> int:
        return self.token_budget * self.num_qo_heads * (self.head_dim + 1) * 4 + (32 << 20)
