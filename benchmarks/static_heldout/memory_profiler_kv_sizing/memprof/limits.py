"""Static engine limits and the sizes derived from them before and after profiling."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass(frozen=True)
class EngineLimits:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    page_size: int = 16
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    intermediate_size: int = 14336
    vocab_size: int = 128256
    # every fourth layer attends to a sliding window only
    window_size: int = 4096
    window_layer_every: int = 4
    gpu_memory_utilization: float = 0.90
    graph_buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256])
    kv_dtype_bytes: int = 2
    # sequences longer than this leave the graphs for the trtllm-gen decode kernel
    long_context_tokens: int = 16384

    @property
    def kv_bytes_per_page(self) -> int:
        """K and V of one page in every layer."""
        return 2 * self.num_layers * self.page_size * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_model_len + self.page_size - 1) // self.page_size

    @property
    def long_context_pages(self) -> int:
        return (self.long_context_tokens + self.page_size - 1) // self.page_size

    def is_window_layer(self, layer_id: int) -> bool:
        return layer_id % self.window_layer_every == self.window_layer_every - 1


@dataclass(frozen=True)
class WorkspaceSizes:
    """FlashInfer scratch derived from the engine limits (split-k partial outputs and LSE in fp32)."""

    decode_graph: int
    trtllm: int
    eager: int
    window: int

    @classmethod
    def from_limits(cls, lim: EngineLimits) -> "WorkspaceSizes":
        per_row = lim.num_qo_heads * (lim.head_dim + 1) * 4
        max_chunks = max(1, lim.max_pages_per_seq // 64)
        decode_graph = lim.max_num_seqs * per_row * min(max_chunks, 32) + (8 << 20)
        trtllm = lim.max_num_seqs * per_row * min(max_chunks, 16) + lim.max_num_seqs * lim.num_qo_heads * 8
        eager = max(lim.max_num_batched_tokens, lim.max_num_seqs * max_chunks) * per_row + (16 << 20)
        window_chunks = max(1, lim.window_size // (64 * lim.page_size))
        window = lim.max_num_seqs * per_row * window_chunks + (8 << 20)
        return cls(decode_graph=decode_graph, trtllm=trtllm, eager=eager, window=window)

    @property
    def total(self) -> int:
        return self.decode_graph + self.trtllm + self.eager + self.window


@dataclass
class KVSizing:
    """What the profiler hands back: pages for the KV cache and what the graphs may still take."""

    num_pages: int
    kv_bytes: int
    graph_budget_bytes: int
    peak_activation_bytes: int
    non_torch_bytes: int
    workspace_bytes: int
    notes: List[str] = field(default_factory=list)

    def describe(self) -> str:
        gib = float(1 << 30)
        return (
            f"{self.num_pages} KV pages ({self.kv_bytes / gib:.2f} GiB), graphs {self.graph_budget_bytes / gib:.2f} GiB, "
            f"peak activations {self.peak_activation_bytes / gib:.2f} GiB, workspaces {self.workspace_bytes / gib:.2f} GiB, "
            f"outside torch {self.non_torch_bytes / gib:.2f} GiB"
        )
