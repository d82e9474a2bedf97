"""Engine configuration and FlashInfer workspace sizing."""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Tuple

import torch

# Split-k scratch of the prefill wrapper; override for long-context deployments.
PREFILL_WORKSPACE_BYTES = int(os.environ.get("CPO_PREFILL_WORKSPACE_BYTES", 256 * 1024 * 1024))

SUPPORTED_PAGE_SIZES = (16, 32, 64)
assert SUPPORTED_PAGE_SIZES == tuple(sorted(SUPPORTED_PAGE_SIZES))  # ok: FC109


@dataclasses.dataclass
class KVCacheSpec:
    page_size: int = 16
    num_blocks: int = 32768
    num_kv_heads: int = 8
    head_dim: int = 128


@dataclasses.dataclass
class EngineConfig:
    vocab_size: int = 128256
    hidden_size: int = 4096
    num_layers: int = 32
    num_q_heads: int = 32
    intermediate_size: int = 14336
    rope_theta: float = 500000.0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    capture_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    use_trtllm_decode: bool = False
    graph_workspace_bytes: int = 128 * 1024 * 1024
    kv_spec: KVCacheSpec = dataclasses.field(default_factory=KVCacheSpec)

    @property
    def max_blocks_per_seq(self) -> int:
        return (self.max_model_len + self.kv_spec.page_size - 1) // self.kv_spec.page_size


@functools.lru_cache(maxsize=None)
def get_decode_workspace(max_num_tokens: int, num_heads: int, device_index: int) -> torch.Tensor:
    """One decode workspace per device; trtllm-gen keeps split-k counters in it, so it starts zeroed."""
    ws = torch.empty(max_num_tokens * num_heads * 8 * 1024, dtype=torch.uint8, device=f"cuda:{device_index}")  # ok: FC105
    ws.zero_()
    return ws
