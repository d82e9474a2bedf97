"""Backend interfaces and the metadata every backend starts from.

A backend class names its metadata builder and its per-layer impl by qualified name; the base class resolves them
when the model runner and the model ask, so that a backend module imports nothing it does not run.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Optional, TypeVar

import numpy as np
import torch

from qrserve.utils import resolve_obj_by_qualname

M = TypeVar("M")


@dataclass
class CommonAttentionMetadata:
    """Per-step inputs shared by all backends: device tensors and their pinned host mirrors."""

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor


def split_decodes_and_prefills(
    common: CommonAttentionMetadata, decode_threshold: int = 1
) -> tuple[int, int, int, int]:
    """(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens); decodes come first in the batch."""
    num_reqs = common.num_reqs
    num_tokens = common.num_actual_tokens
    if common.max_query_len <= decode_threshold:
        return num_reqs, 0, num_tokens, 0
    query_lens_np = np.diff(common.query_start_loc_cpu[: num_reqs + 1].numpy())
    is_prefill = query_lens_np > decode_threshold
    first_prefill = int(is_prefill.argmax())
    num_decode_tokens = int(common.query_start_loc_cpu[first_prefill])
    return first_prefill, num_reqs - first_prefill, num_decode_tokens, num_tokens - num_decode_tokens


class AttentionBackend(abc.ABC):
    """A backend is a bag of names: subclasses set the qualified names of their builder and impl."""

    builder_qualname: ClassVar[str]
    impl_qualname: ClassVar[str]

    @staticmethod
    @abc.abstractmethod
    def get_name() -> str: ...

    @staticmethod
    @abc.abstractmethod
    def get_kv_cache_shape(
        num_blocks: int, page_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]: ...

    @classmethod
    def get_builder_cls(cls) -> type[AttentionMetadataBuilder[Any]]:
        return resolve_obj_by_qualname(cls.builder_qualname)

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return resolve_obj_by_qualname(cls.impl_qualname)


class AttentionMetadataBuilder(abc.ABC, Generic[M]):
    @abc.abstractmethod
    def build(self, common_prefix_len: int, common: CommonAttentionMetadata) -> M: ...

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> M:
        raise NotImplementedError(f"{type(self).__name__} cannot be captured in a CUDA graph")


class AttentionImpl(abc.ABC):
    sliding_window: Optional[int] = None

    @abc.abstractmethod
    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: Any,
        output: torch.Tensor,
    ) -> torch.Tensor: ...
