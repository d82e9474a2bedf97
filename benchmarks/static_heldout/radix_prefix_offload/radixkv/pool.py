from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class KVPoolBuffers:
    """Device-side pool state shared by the prefix cache and the attention kernels."""

    num_pages: int
    page_size: int
    num_kv_heads: int
    head_dim: int
    workspace: torch.Tensor = field(
        default_factory=lambda: torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # expect: FC105, FC106
    )

    def __post_init__(self) -> None:
        self.kv = torch.zeros(self.num_pages, 2, self.page_size, self.num_kv_heads, self.head_dim,
                              dtype=torch.bfloat16, device="cuda")
