"""Engine configuration objects."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property

import torch


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = 3

    def has_full_cudagraphs(self) -> bool:
        return self in (CUDAGraphMode.FULL, CUDAGraphMode.FULL_DECODE_ONLY)

    def decode_mode(self) -> "CUDAGraphMode":
        return CUDAGraphMode.FULL if self.has_full_cudagraphs() else self

    def mixed_mode(self) -> "CUDAGraphMode":
        return CUDAGraphMode.NONE if self is CUDAGraphMode.FULL_DECODE_ONLY else self


@dataclass
class ModelConfig:
    max_model_len: int = 8192
    num_attention_heads: int = 32
    num_kv_heads: int = 8
    head_size: int = 128
    num_layers: int = 2
    dtype: torch.dtype = torch.bfloat16


@dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    async_scheduling: bool = False


@dataclass
class CompilationConfig:
    cudagraph_mode: CUDAGraphMode = CUDAGraphMode.FULL_DECODE_ONLY
    cudagraph_capture_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    cudagraph_num_of_warmups: int = 1

    @cached_property
    def max_capture_size(self) -> int:
        return max(self.cudagraph_capture_sizes) if self.cudagraph_capture_sizes else 0

    @cached_property
    def _bs_to_padded(self) -> dict[int, int]:
        padded: dict[int, int] = {}
        sizes = sorted(self.cudagraph_capture_sizes)
        for bs in range(1, self.max_capture_size + 1):
            padded[bs] = next(s for s in sizes if s >= bs)
        return padded

    def pad_for_cudagraph(self, batch_size: int) -> int:
        return self._bs_to_padded[batch_size]


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)

    def pad_for_cudagraph(self, batch_size: int) -> int:
        return self.compilation_config.pad_for_cudagraph(batch_size)
