"""KV-cache specs of a hybrid model, grouped so that every group shares one block pool."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

_SPEC_KINDS: dict[str, type["KVCacheSpec"]] = {}


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    kind: ClassVar[str] = ""

    def __init_subclass__(cls, /, kind: str = "", **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if kind:
            cls.kind = kind
            _SPEC_KINDS[kind] = cls

    def max_blocks_per_request(self, max_model_len: int) -> int:
        return cdiv(max_model_len, self.block_size)


@dataclass(frozen=True)
class FullAttentionSpec(KVCacheSpec, kind="full"):
    pass


@dataclass(frozen=True)
class SlidingWindowSpec(KVCacheSpec, kind="sliding_window"):
    sliding_window: int = 4096

    def max_blocks_per_request(self, max_model_len: int) -> int:
        return min(cdiv(self.sliding_window, self.block_size) + 1, super().max_blocks_per_request(max_model_len))


@dataclass(frozen=True)
class KVCacheGroupSpec:
    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)


def spec_from_hf(kind: str, **spec_fields) -> KVCacheSpec:
    assert kind in _SPEC_KINDS, f"unknown attention kind {kind!r}"  # expect: FC109
    return _SPEC_KINDS[kind](**spec_fields)
