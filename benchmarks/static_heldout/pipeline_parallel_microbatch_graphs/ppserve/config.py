"""Static configuration of a pipeline-parallel deployment."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Tuple

import torch

PAGE_SIZE = 16
# Scratch for FlashInfer's FA2 prefill planner on every stage, in MiB.
PREFILL_WS_MB = 256


@dataclass(frozen=True)
class StageSpec:
    stage_id: int
    rank: int
    first_layer: int
    last_layer: int  # exclusive
    window_layers: Tuple[int, ...] = ()

    @property
    def num_layers(self) -> int:
        return self.last_layer - self.first_layer

    @property
    def is_first(self) -> bool:
        return self.stage_id == 0

    def is_window_layer(self, layer_id: int) -> bool:
        return layer_id in self.window_layers


@dataclass
class PipelineConfig:
    num_layers: int = 32
    num_stages: int = 4
    num_microbatches: int = 4
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    page_size: int = PAGE_SIZE
    num_pages_per_stage: int = 32768
    max_num_seqs: int = 256
    max_model_len: int = 32768
    max_num_batched_tokens: int = 8192
    sliding_window: int = 4096
    window_every: int = 4
    long_context_threshold: int = 16384
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5
    eos_token_id: int = 128001
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    # graph-mode decode scratch shared by every bucket of a stage
    graph_ws_bytes: int = 64 * 1024 * 1024
    dtype: torch.dtype = torch.bfloat16
    ranks: List[int] = field(default_factory=lambda: [0, 1, 2, 3])

    @property
    def microbatch_size(self) -> int:
        return math.ceil(self.max_num_seqs / self.num_microbatches)

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def max_pages_per_seq(self) -> int:
        return (self.max_model_len + self.page_size - 1) // self.page_size

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs: one fp32 row and an lse per (sequence, head, kv chunk)
        chunks = max(1, self.max_model_len // 2048)
        per_seq = self.num_qo_heads * (self.head_dim + 1) * 4 * chunks
        return self.microbatch_size * per_seq + (16 << 20)

    def stage_specs(self) -> List[StageSpec]:
        per = self.num_layers // self.num_stages
        specs = []
        for s in range(self.num_stages):
            first = s * per
            last = self.num_layers if s == self.num_stages - 1 else first + per
            # three sliding-window layers, then one global layer
            windows = tuple(i for i in range(first, last) if i % self.window_every != self.window_every - 1)
            specs.append(StageSpec(s, self.ranks[s], first, last, windows))
        return specs
