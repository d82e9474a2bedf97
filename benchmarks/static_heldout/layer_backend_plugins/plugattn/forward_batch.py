"""What every plugin sees of a step."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List, Optional

import torch


class Mode(str, enum.Enum):
    DECODE = "decode"
    EXTEND = "extend"


@dataclass
class ForwardBatch:
    mode: Mode
    bs: int
    seq_lens: torch.Tensor                 # device
    seq_lens_cpu: torch.Tensor             # host
    req_pool_indices: torch.Tensor         # device
    kv_indptr_cpu: torch.Tensor            # pinned
    kv_indices: torch.Tensor               # device, flattened page ids of the batch
    kv_last_page_len_cpu: torch.Tensor     # pinned
    qo_indptr_cpu: Optional[torch.Tensor] = None
    is_decode: bool = True
    shared_prefix_pages: Optional[torch.Tensor] = None
    extra: dict = field(default_factory=dict)


@dataclass
class PluginConfig:
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    max_bs: int
    max_pages: int
    window: int = 4096
    workspace_bytes: int = 256 << 20
    graph_batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
