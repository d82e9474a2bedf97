"""Backend-independent attention interfaces and the per-step metadata the runner fills."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class CommonAttentionMetadata:
    """One step's batch, requests in decode-first order.

    Device tensors are views of the runner's persistent buffers; ``*_cpu`` are their pinned mirrors.
    """

    num_reqs: int
    num_decodes: int
    num_prefills: int
    num_actual_tokens: int
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_table_cpu: torch.Tensor
    slot_mapping: torch.Tensor
    # Decode-only batch that replays the captured graph of ``padded_num_reqs`` rows.
    use_cuda_graph: bool = False
    padded_num_reqs: int = 0


class AttentionImpl(ABC):
    @abstractmethod
    def forward(self, layer: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: Any, output: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class AttentionMetadataBuilder(ABC):
    @abstractmethod
    def build(self, common: CommonAttentionMetadata) -> Any:
        """Per-step metadata (plans the backend's kernels for this batch)."""
        raise NotImplementedError

    @abstractmethod
    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> Any:
        raise NotImplementedError


class AttentionBackend(ABC):
    @staticmethod
    @abstractmethod
    def get_name() -> str:
        raise NotImplementedError

    @staticmethod
    @abstractmethod
    def get_impl_cls() -> type[AttentionImpl]:
        raise NotImplementedError

    @staticmethod
    @abstractmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]:
        raise NotImplementedError

    @staticmethod
    @abstractmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           kv_layout: str) -> tuple[int, ...]:
        raise NotImplementedError

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [64, 128, 256]
