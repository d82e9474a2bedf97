"""Server limits."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Tuple

PAGE_SIZE = 16
assert PAGE_SIZE & (PAGE_SIZE - 1) == 0, "page size must be a power of two"  # ok: FC109


@dataclass
class ServerConfig:
    max_running: int = 256
    max_context: int = 32768
    max_prefix_pages: int = 8192
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    cuda_graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)
    sm_major: int = 9
    device: str = "cuda"
    # per-instance budgets (operators override them per deployment)
    prefix_workspace_bytes: int = 256 << 20
    suffix_workspace_bytes: int = 256 << 20
    # shared by every instance: the cascade planner's budget
    cascade_workspace_bytes: ClassVar[int] = 384 << 20

    @property
    def max_suffix_pages(self) -> int:
        return self.max_running * ((self.max_context + PAGE_SIZE - 1) // PAGE_SIZE)

    @property
    def num_pages(self) -> int:
        return self.max_prefix_pages + self.max_suffix_pages
