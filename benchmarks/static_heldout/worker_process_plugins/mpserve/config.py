"""Engine configuration shared by the driver and the workers (pickled on spawn)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Tuple

# Workspace of the per-bucket CUDA-graph decode wrappers. Picked once on an 8B
# model at batch 64 and never revisited.
GRAPH_WORKSPACE_BYTES: Final[int] = 128 * 1024 * 1024

# Head dims the trtllm-gen decode cubins are built for.
TRTLLM_GEN_HEAD_DIMS: Final[Tuple[int, ...]] = (64, 128)

ENTRY_POINT_GROUP: Final[str] = "mpserve.attention_backends"


@dataclass(frozen=True)
class EngineConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 32000
    page_size: int = 16
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_seq_len: int = 32768
    max_num_pages: int = 65536
    world_size: int = 1
    attn_backend: str = "flashinfer"
    graph_buckets: Tuple[int, ...] = field(default=(1, 2, 4, 8, 16, 32, 64, 128))
    eos_token_id: int = 2

    def __post_init__(self) -> None:
        if self.max_batch_size <= 0 or self.max_num_tokens < self.max_batch_size:
            raise ValueError(
                f"max_batch_size={self.max_batch_size} must be positive and at most "
                f"max_num_tokens={self.max_num_tokens}"
            )
        if self.graph_buckets and max(self.graph_buckets) > self.max_batch_size:
            raise ValueError(f"graph bucket above max_batch_size={self.max_batch_size}")

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    def workspace_bytes(self) -> int:
        """Float workspace for split-k partial outputs plus the planner's int state.

        Bounded by the largest step: every token of every qo head may hold a
        partial output (head_dim floats and one lse) per split.
        """
        rows = max(self.max_num_tokens, self.max_batch_size * 16)
        partial = rows * self.num_qo_heads * (self.head_dim + 1) * 4
        int_state = (self.max_batch_size + 1) * 64 * 4
        return partial + int_state
