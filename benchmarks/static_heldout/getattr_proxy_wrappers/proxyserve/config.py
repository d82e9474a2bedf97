"""Serving limits and workspace sizes."""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Dict, Tuple

import torch

PAGE_SIZE = 16
GRAPH_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)
assert GRAPH_BUCKETS == tuple(sorted(GRAPH_BUCKETS)), "graph buckets must be ascending"  # ok: FC109

# Workspace sizes picked on the launch benchmark (Llama-3-8B, 4k context).
DECODE_WS_BYTES = 192 * 1024 * 1024
_WS_MIB: Dict[str, int] = {"window": 48, "cascade": 64}
paged_ws_bytes = lambda: 160 << 20  # noqa: E731


class WsSize(enum.IntEnum):
    RAGGED = 256 << 20
    GRAPH = 96 << 20


@dataclass(frozen=True)
class ServeConfig:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    num_layers: int = 32
    window: int = 4096
    window_every: int = 2
    fp8_kv_layers: Tuple[int, ...] = ()
    shared_prefix_pages: int = 0
    use_trtllm_decode: bool = False
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    float_ws_bytes: int = 128 << 20

    @property
    def max_pages(self) -> int:
        return self.max_batch_size * self.max_context_len // PAGE_SIZE

    @property
    def decode_backend(self) -> str:
        return "trtllm-gen" if self.use_trtllm_decode else "fa2"


@functools.lru_cache(maxsize=None)
def scratch_workspace(nbytes: int, device: str) -> torch.Tensor:
    """Split-k scratch shared by the eager decode paths of every layer."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
