"""Head placement per TP degree."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelDims:
    num_layers: int = 32
    hidden: int = 4096
    ffn: int = 14336
    num_q_heads: int = 32
    num_kv_heads: int = 2
    head_dim: int = 128
    vocab: int = 128256


@dataclasses.dataclass(frozen=True)
class TPLayout:
    tp: int
    rank: int
    q_heads: int
    kv_heads: int
    kv_replicated: bool  # fewer KV heads than ranks: each rank keeps one copy

    @property
    def q_start(self) -> int:
        return self.rank * self.q_heads

    def kv_head_of_rank(self, num_kv_heads: int) -> int:
        return (self.rank * num_kv_heads) // self.tp


def layout_for(dims: ModelDims, tp: int, rank: int) -> TPLayout:
    if dims.num_q_heads % tp:
        raise ValueError(f"{dims.num_q_heads} query heads do not split over TP={tp}")
    replicated = dims.num_kv_heads < tp
    kv_heads = 1 if replicated else dims.num_kv_heads // tp
    return TPLayout(tp=tp, rank=rank, q_heads=dims.num_q_heads // tp, kv_heads=kv_heads, kv_replicated=replicated)
