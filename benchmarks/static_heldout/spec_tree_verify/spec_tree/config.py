from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import torch

from spec_tree.tree import TreeSpec

DEFAULT_CHOICES = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)]


@dataclass
class SpecConfig:
    max_batch_size: int = 32
    max_context_len: int = 8192
    page_size: int = 16
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype: torch.dtype = torch.bfloat16
    topk: int = 4
    num_draft_steps: int = 4
    eos_token_id: int = 2
    capture_bs: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    tree: TreeSpec = field(default_factory=lambda: TreeSpec.from_choices(DEFAULT_CHOICES))

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size
