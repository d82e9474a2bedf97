"""Engine configuration and the module-level defaults the engine ships with.

This module is imported eagerly by ``lazyserve/__init__.py``; it must not import torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

__all__ = ["EngineConfig", "DEFAULT_PAGE_SIZE", "GRAPH_BATCH_SIZES", "TRTLLM_WORKSPACE_MB"]

DEFAULT_PAGE_SIZE = 16
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)

# trtllm-gen keeps its multi-CTA counters and split-k partials in this scratch buffer.
# Sized when the engine only served 8k contexts.
TRTLLM_WORKSPACE_MB = 256

assert DEFAULT_PAGE_SIZE & (DEFAULT_PAGE_SIZE - 1) == 0  # ok: FC109


@dataclass
class EngineConfig:
    model_path: str = ""
    num_layers: int = 32
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5

    page_size: int = DEFAULT_PAGE_SIZE
    num_pages: int = 65536
    max_batch_size: int = 128
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    sliding_window: int = 4096
    sliding_window_layers: Tuple[int, ...] = ()

    attention_backend: str = "flashinfer"  # key of layers.attention.BACKEND_MODULES
    decode_kernel: str = "fa2"  # "fa2" or "trtllm-gen" (Blackwell)
    decode_workspace_bytes: int = 128 * 1024 * 1024
    cuda_graph_bs: List[int] = field(default_factory=lambda: list(GRAPH_BATCH_SIZES))
    disable_cuda_graph: bool = False

    eos_token_id: int = 128001
    stop_token_ids: Tuple[int, ...] = (128008, 128009)
    max_top_k: int = 64

    def __post_init__(self) -> None:
        if self.page_size <= 0 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        assert max(self.cuda_graph_bs) <= self.max_batch_size, "graph bucket above max_batch_size"  # expect: FC109

    def max_pages_per_seq(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size

    def prefill_workspace_bytes(self) -> int:
        """Split-k partial outputs of the largest step (fp32 output + lse per head), doubled for headroom."""
        per_token = self.num_qo_heads * (self.head_dim * 4 + 4)
        return max(2 * self.max_num_tokens * per_token, 64 << 20)
