from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch


@dataclasses.dataclass
class DLLMConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 32
    head_dim: int = 128
    hidden_size: int = 4096
    vocab_size: int = 126464
    mask_id: int = 126336
    page_size: int = 16
    num_pages: int = 131072
    max_pages_per_req: int = 512
    block_lens: tuple = (32, 64)
    steps_per_block: int = 32
    graph_bs: tuple = (1, 2, 4, 8, 16)
    dtype: torch.dtype = torch.bfloat16


@dataclasses.dataclass
class AttnLimits:
    # eager prefix attention; per deployment (long prompts need more)
    prefill_ws_bytes: int = 256 << 20
    # every (batch, block length) graph shares one workspace
    graph_ws_bytes: ClassVar[int] = 192 << 20
