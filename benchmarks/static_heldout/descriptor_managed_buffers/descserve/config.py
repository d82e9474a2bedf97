"""Engine configuration and the few module-level sizes the engine keeps."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import List

# FA2 ragged-prefill scratch.  The split-k partials of an 8k-token prefill fit in 256 MiB
# on the benchmark model, so the ragged wrapper gets a fixed buffer.
RAGGED_WORKSPACE_BYTES = 256 * 1024 * 1024

# Sliding-window decode scratch.  Start-up replaces the placeholder with a size derived
# from the engine limits (``tune_workspaces``) before any backend is built; backends read
# it through the module (``engine_config.SWA_WORKSPACE_BYTES``), never by ``from ... import``.
SWA_WORKSPACE_BYTES = 64 * 1024 * 1024

# KV pool page counts are rounded to this many pages (allocator granularity).
KV_POOL_ALIGN = 256


@dataclass
class EngineConfig:
    model_path: str = ""
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    page_size: int = 16
    num_pages: int = 65536
    max_running_requests: int = 256
    max_context_len: int = 32768
    max_num_tokens: int = 16384
    chunked_prefill_size: int = 8192
    cuda_graph_max_bs: int = 160
    cuda_graph_bs: List[int] = field(default_factory=list)
    sliding_window: int = -1
    sliding_window_every: int = 0
    attention_backend: str = "flashinfer"
    draft_attention_backend: str = "fa2"
    speculative_num_steps: int = 0
    draft_extend_workspace_bytes: int = 128 << 20

    def __post_init__(self) -> None:
        if self.page_size <= 0 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        if self.attention_backend not in ("flashinfer", "trtllm"):
            raise ValueError(f"unknown attention backend {self.attention_backend!r}")

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size

    def workspace_bytes(self) -> int:
        """Float workspace the planners need at the engine's limits.

        Split-k keeps one partial output (fp32, head_dim values plus the LSE) per row, head and
        chunk; rows are bounded by the larger of a prefill chunk and the running batch.
        """
        rows = max(self.chunked_prefill_size, self.max_running_requests)
        return rows * self.num_qo_heads * (self.head_dim + 1) * 4 * 8 + (16 << 20)

    def capture_batch_sizes(self) -> List[int]:
        if self.cuda_graph_bs:
            return sorted(set(self.cuda_graph_bs))
        sizes = [1, 2, 4] + list(range(8, self.cuda_graph_max_bs + 1, 8))
        return [bs for bs in sizes if bs <= self.cuda_graph_max_bs]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "EngineConfig":
        return cls(
            model_path=args.model_path,
            page_size=args.page_size,
            num_pages=args.num_pages,
            max_running_requests=args.max_running_requests,
            max_context_len=args.context_length,
            max_num_tokens=args.max_num_tokens,
            chunked_prefill_size=args.chunked_prefill_size,
            cuda_graph_max_bs=args.cuda_graph_max_bs,
            attention_backend=args.attention_backend,
            draft_attention_backend=args.draft_attention_backend,
            speculative_num_steps=args.speculative_num_steps,
            draft_extend_workspace_bytes=args.draft_extend_workspace_mb << 20,
        )


def tune_workspaces(cfg: EngineConfig) -> None:
    """Replace the start-up placeholders with sizes derived from ``cfg``."""
    global SWA_WORKSPACE_BYTES
    SWA_WORKSPACE_BYTES = max(cfg.workspace_bytes() // 4, 32 << 20)

