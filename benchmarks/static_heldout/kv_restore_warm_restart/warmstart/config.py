from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Tuple

import torch


@dataclass
class RestartConfig:
    snapshot_dir: str = "/var/lib/warmstart/snapshot"
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 32000
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_num_reqs: int = 256
    max_total_pages: int = 131072
    max_pages_per_req: int = 4096
    max_staging_pages: int = 8192
    cuda_graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    disable_cuda_graph: bool = False
    workspace_bytes: int = 256 << 20
    tail_recompute_tokens: int = 64
    dtype: torch.dtype = torch.bfloat16

    # every graph-mode decode wrapper shares this one; snapshots record the size they were taken with
    GRAPH_WORKSPACE_BYTES: ClassVar[int] = 384 << 20

    def tail_workspace_bytes(self) -> int:
        # trtllm context pass over the unpersisted tail of every resumed request
        return self.max_num_reqs * self.num_qo_heads * self.tail_recompute_tokens * self.head_dim * 4 + (16 << 20)

    def verify_workspace_bytes(self) -> int:
        return self.max_num_reqs * self.num_qo_heads * (self.max_pages_per_req // 16) * 4 + (8 << 20)
