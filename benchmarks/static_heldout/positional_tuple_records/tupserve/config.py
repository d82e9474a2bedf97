"""Engine limits and FlashInfer workspace sizing."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# FlashInfer float workspaces, by tier; indexed with the WS_* slots.
WS_DECODE = 0
WS_PREFILL = 1
WORKSPACE_TIERS = (128 * 1024 * 1024, 384 * 1024 * 1024)


@dataclass(frozen=True)
class EngineConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    page_size: int = 16
    num_pages: int = 65536
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_seq_len: int = 32768
    sliding_window: int = 0
    window_layer_stride: int = 2
    capture_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    enable_cuda_graph: bool = True
    use_trtllm_decode: bool = False
    eos_token_id: int = 128001
    compact_threshold: float = 0.3
    dtype: torch.dtype = torch.bfloat16
    device_id: int = 0

    @property
    def gqa_group_size(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def max_pages_per_req(self) -> int:
        return -(-self.max_seq_len // self.page_size)

    @property
    def window_pages(self) -> int:
        # pages a sliding-window layer may touch: the window plus a partial page
        return -(-self.sliding_window // self.page_size) + 1

    def is_window_layer(self, layer_id: int) -> bool:
        return self.sliding_window > 0 and layer_id % self.window_layer_stride == 1

    def window_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32) and LSEs of every decode row, at most 16 chunks
        per_row = self.num_qo_heads * (self.head_dim * 4 + 4) * 16
        return self.max_batch_size * per_row + (8 << 20)


def prefill_workspace_bytes(cfg: EngineConfig) -> int:
    """Float workspace of one chunked-prefill step: partial outputs and LSEs per token."""
    per_token = cfg.num_qo_heads * (cfg.head_dim * 4 + 4)
    return 2 * cfg.max_num_tokens * per_token + (16 << 20)


def trtllm_workspace_bytes(cfg: EngineConfig) -> int:
    # trtllm-gen keeps its multi-CTA counters and partials per (row, head)
    return cfg.max_batch_size * cfg.num_qo_heads * (cfg.head_dim * 4 + 64) * 8 + (4 << 20)


def graph_workspace_bytes() -> int:
    """Workspace shared by the captured decode buckets."""
    return int(os.environ.get("TUPSERVE_GRAPH_WORKSPACE_BYTES", 192 * 1024 * 1024))
