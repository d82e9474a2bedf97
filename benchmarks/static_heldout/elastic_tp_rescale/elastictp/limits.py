"""Engine limits and workspace sizing."""
from __future__ import annotations

import dataclasses
from typing import Tuple

import torch


@dataclasses.dataclass
class EngineLimits:
    max_num_tokens: int = 8192
    max_batch: int = 128
    page_size: int = 16
    num_pages: int = 65536
    max_pages_per_req: int = 2048
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    supported_tp: Tuple[int, ...] = (2, 4)
    dtype: torch.dtype = torch.bfloat16

    def decode_ws_bytes(self, q_heads: int, head_dim: int) -> int:
        # split-k partials for every token and local head, two chunks, plus lse
        return 2 * self.max_num_tokens * q_heads * (head_dim + 1) * 4 + (8 << 20)

    def trtllm_ws_bytes(self, q_heads: int, head_dim: int) -> int:
        return self.max_batch * q_heads * head_dim * 4 * 16 + (2 << 20)


def zeroed_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.fill_(0)
    return ws
