"""Engine configuration and the few limits the engine fixes in code."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

MiB = 1 << 20

# Kernel limits, not batch limits.
MAX_PAGE_SIZE = 128
SUPPORTED_KV_LAYOUTS = ("NHD", "HND")
assert MAX_PAGE_SIZE & (MAX_PAGE_SIZE - 1) == 0, "page sizes are powers of two"  # ok: FC109

# Wrap every FlashInfer run() in a profiler range (see attention/tracing.py).
TRACE_KERNELS = os.environ.get("DYNSERVE_TRACE_KERNELS", "0") == "1"
# NVTX ranges around every registered module's forward (see meta.py).
ENABLE_NVTX = os.environ.get("DYNSERVE_NVTX", "0") == "1"


@dataclass
class EngineConfig:
    model_path: str
    architecture: str = "llama"
    vocab_size: int = 128256
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_layers: int = 32
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 500000.0
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-5
    eos_token_id: int = 128001

    page_size: int = 16
    num_pages: int = 65536
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    cuda_graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)

    kv_layout: str = "NHD"
    decode_backend: str = "auto"
    features: tuple[str, ...] = ("decode", "prefill", "graph")
    sliding_window: Optional[int] = None
    window_layer_stride: int = 2
    num_draft_tokens: int = 0
    # scratch of the speculative verify prefill wrapper; a deployment knob like the others
    verify_workspace_bytes: int = 256 * MiB

    dtype: torch.dtype = torch.bfloat16
    device: str = "cuda"

    def __post_init__(self) -> None:
        if self.page_size > MAX_PAGE_SIZE or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size={self.page_size} must be a power of two <= {MAX_PAGE_SIZE}")
        if self.kv_layout not in SUPPORTED_KV_LAYOUTS:
            raise ValueError(f"kv_layout={self.kv_layout!r}; expected one of {SUPPORTED_KV_LAYOUTS}")
        if max(self.cuda_graph_batch_sizes) > self.max_batch_size:
            raise ValueError("cuda_graph_batch_sizes exceed max_batch_size")

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size

    def float_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32) and their lse for the largest step, twice for the plan's headroom
        partial = self.max_num_tokens * self.num_q_heads * (self.head_dim + 1) * 4
        return max(64 * MiB, 2 * partial)
