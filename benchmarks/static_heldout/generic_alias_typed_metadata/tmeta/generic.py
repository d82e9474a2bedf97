"""Typed containers and interfaces shared by the attention backends and the graph runner."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Generic, Optional, Protocol, Self, TypeVar

import torch

if TYPE_CHECKING:
    from tmeta.metadata import MetadataBase

TMeta = TypeVar("TMeta", bound="MetadataBase")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class MetadataSlot(Generic[TMeta]):
    """Holds the metadata of the step in flight: the backend publishes it, the layers read it."""

    __slots__ = ("_name", "_value", "_generation")

    def __init__(self, name: str) -> None:
        self._name = name
        self._value: Optional[TMeta] = None
        self._generation = 0

    def publish(self, meta: TMeta) -> TMeta:
        self._value = meta
        self._generation += 1
        return meta

    def get(self) -> TMeta:
        value = self._value
        if value is None:
            raise RuntimeError(f"no {self._name} metadata has been published for this step")
        return value

    def peek(self) -> Optional[TMeta]:
        return self._value

    def clear(self) -> None:
        self._value = None

    @property
    def generation(self) -> int:
        return self._generation


class BucketTable(Generic[K, V]):
    """Insertion-ordered map keyed by graph bucket (or by buffer name)."""

    def __init__(self) -> None:
        self._items: dict[K, V] = {}

    def put(self, key: K, value: V) -> Self:
        self._items[key] = value
        return self

    def __getitem__(self, key: K) -> V:
        try:
            return self._items[key]
        except KeyError:
            raise KeyError(f"no entry for {key!r}; have {list(self._items)}") from None

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def keys(self) -> Iterator[K]:
        return iter(self._items)

    def values(self) -> Iterator[V]:
        return iter(self._items.values())

    def items(self) -> Iterator[tuple[K, V]]:
        return iter(self._items.items())


class PagePool(Protocol):
    """What the attention backends need from the request-to-page table."""

    page_size: int
    req_to_page: torch.Tensor

    def page_counts(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor: ...

    def fill_indices(
        self,
        out: torch.Tensor,
        req_pool_indices: torch.Tensor,
        kv_indptr: torch.Tensor,
        bs: int,
        total: int,
    ) -> None: ...


class AttentionBackend(Protocol):
    """The calls a decoder layer makes into its attention backend."""

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor: ...

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor: ...
