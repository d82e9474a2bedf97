"""Attention metadata for one forward step, and the typed helpers around it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional, Self, TypeAlias, Union, overload

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from tmeta.generic import TMeta

if TYPE_CHECKING:
    from tmeta.batch import ForwardBatch


@dataclass
class MetadataBase:
    batch_size: int
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor

    def with_batch_size(self, batch_size: int) -> Self:
        return dataclasses.replace(self, batch_size=batch_size)


@dataclass
class DecodeMetadata(MetadataBase):
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    max_kv_len: int = 0
    wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    window_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    graph_bucket: Optional[int] = None
    use_long_ctx: bool = False


@dataclass
class ExtendMetadata(MetadataBase):
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    prefix_lens_cpu: torch.Tensor
    wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None


AttnMetadata = Union[DecodeMetadata, ExtendMetadata]
Meta = DecodeMetadata | ExtendMetadata
StepMeta: TypeAlias = "DecodeMetadata | ExtendMetadata"


def build_metadata(cls: type[TMeta], batch: "ForwardBatch", **fields: object) -> TMeta:
    """Build ``cls`` for ``batch``: the lengths come from the batch, the rest from ``fields``."""
    return cls(
        batch_size=batch.batch_size,
        seq_lens=batch.seq_lens,
        seq_lens_cpu=batch.seq_lens_cpu,
        **fields,
    )


@overload
def last_page_lens(meta: DecodeMetadata, *, host: Literal[True]) -> torch.Tensor: ...


@overload
def last_page_lens(meta: DecodeMetadata, *, host: Literal[False] = ...) -> torch.Tensor: ...


def last_page_lens(meta: DecodeMetadata, *, host: bool = False) -> torch.Tensor:
    """The last-page lengths of ``meta``; the pinned mirror when ``host``."""
    return meta.kv_last_page_len_cpu if host else meta.kv_last_page_len


@overload
def total_kv_pages(meta: DecodeMetadata) -> int: ...


@overload
def total_kv_pages(meta: ExtendMetadata) -> int: ...


def total_kv_pages(meta: AttnMetadata) -> int:
    """Pages the step reads, for the scheduler's occupancy gauge."""
    if isinstance(meta, DecodeMetadata):
        return int(meta.kv_indptr[meta.batch_size])  # expect: FC101
    return int(meta.kv_indptr_cpu[-1])  # ok: FC101
