"""Serving limits of the shared-expert MoE server."""

from __future__ import annotations

import dataclasses
from typing import Tuple


def default_prefill_workspace_bytes() -> int:
    # Measured once on the benchmark prompt mix (4k prompts, batch 8).
    return 384 * 1024 * 1024


@dataclasses.dataclass
class ServeConfig:
    num_layers: int = 4
    hidden_size: int = 2048
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    num_experts: int = 64
    top_k: int = 6
    moe_intermediate: int = 1408
    shared_intermediate: int = 2816
    max_running_requests: int = 256
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    cuda_graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    trtllm_context_threshold: int = 16384
    overlap_shared_expert: bool = True
    inline_shared_below: int = 4
    sys_prompt_pages: int = 0

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size

    @property
    def num_pages(self) -> int:
        return self.max_running_requests * self.max_pages_per_req

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs + LSE for every running row, 32 chunks at most
        per_row = self.num_qo_heads * (self.head_dim + 1) * 4 * 32
        return max(64 << 20, self.max_running_requests * per_row)

    def graph_workspace_bytes(self) -> int:
        per_row = self.num_qo_heads * (self.head_dim + 1) * 4 * 32
        return max(self.cuda_graph_bs) * per_row + (16 << 20)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_running_requests * self.num_qo_heads * self.head_dim * 4 * 16
