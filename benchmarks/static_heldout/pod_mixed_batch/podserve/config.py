"""Engine limits of the POD mixed-batch server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

# Workspace shared by every decode graph (FlashInfer split-k scratch), as tuned on the reference box.
DECODE_GRAPH_WORKSPACE_BYTES = 256 * 1024 * 1024
# Eager iterations before each capture, so that lazy JIT modules are loaded.
GRAPH_WARMUP_ITERS = 2


@dataclass
class PodConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_num_pages: int = 65536
    max_batch_size: int = 256
    max_num_tokens: int = 8192  # token budget of one step: one prefill chunk + all decodes
    max_prefill_chunk: int = 2048
    vocab_size: int = 128256
    eos_token_id: int = 128001
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    mixed_graph_shapes: Tuple[Tuple[int, int], ...] = ((256, 16), (512, 32))
    kv_layout: str = "NHD"
    use_trtllm_decode: bool = False
    dtype: torch.dtype = torch.bfloat16

    @property
    def max_graph_bs(self) -> int:
        return self.graph_buckets[-1]

    def workspace_bytes(self) -> int:
        # split-k partial outputs: tokens x heads x (head_dim fp32 + lse), twice for POD's two kernels
        per_token = self.num_qo_heads * (self.head_dim + 1) * 4
        return 2 * self.max_num_tokens * per_token + (16 << 20)

    def graph_workspace_bytes(self, bs: int) -> int:
        per_row = self.num_qo_heads * (self.head_dim + 1) * 4
        return (bs + self.max_prefill_chunk) * per_row * 2 + (8 << 20)
