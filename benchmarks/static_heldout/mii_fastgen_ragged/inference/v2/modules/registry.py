"""Module registry: implementations register under a name, the engine picks one from a ConfigBundle."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, NamedTuple, Optional, Type

import torch


@dataclass
class DSSelfAttentionConfig:
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    max_seqs: int
    max_tokens: int
    max_blocks_per_seq: int
    dtype: torch.dtype = torch.bfloat16


@dataclass
class ConfigBundle:
    name: str
    config: DSSelfAttentionConfig
    implementation_config: Dict[str, Any] = field(default_factory=dict)


class AttnAtoms(NamedTuple):
    num_decode_tokens: int
    num_prefill_seqs: int
    decode_wrapper: Any
    max_seq_len: int


class DSSelfAttentionBase(abc.ABC):
    def __init__(self, config: DSSelfAttentionConfig, backend: str) -> None:
        self.config = config
        self._backend = backend

    @property
    def backend(self) -> str:
        return self._backend  # ok: FC103

    @abc.abstractmethod
    def build_atoms(self, view, bucket: Optional[int]) -> AttnAtoms: ...

    @abc.abstractmethod
    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, atoms: AttnAtoms) -> torch.Tensor: ...


class DSAttentionRegistry:
    registry: ClassVar[Dict[str, Type[DSSelfAttentionBase]]] = {}

    @classmethod
    def register_module(cls, impl: Type[DSSelfAttentionBase]) -> Type[DSSelfAttentionBase]:
        cls.registry[impl.name] = impl
        return impl

    @classmethod
    def instantiate_config(cls, bundle: ConfigBundle, device: torch.device) -> DSSelfAttentionBase:
        return cls.registry[bundle.name](bundle.config, device, **bundle.implementation_config)
