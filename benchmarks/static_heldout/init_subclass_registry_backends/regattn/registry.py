"""Name-keyed registries: attention backends register through __init_subclass__, workspaces through a metaclass."""

from __future__ import annotations

import abc
from typing import ClassVar, Optional

import torch

from regattn.config import ServeConfig


class AttentionBackend(abc.ABC):
    _registry: ClassVar[dict[str, type[AttentionBackend]]] = {}
    decode_backend: ClassVar[str] = "fa2"

    def __init_subclass__(cls, name: Optional[str] = None, decode_backend: Optional[str] = None, **kw):
        super().__init_subclass__(**kw)
        if decode_backend is not None:
            cls.decode_backend = decode_backend
        if name is not None:
            if name in AttentionBackend._registry:
                raise ValueError(f"attention backend {name!r} registered twice")
            AttentionBackend._registry[name] = cls

    @classmethod
    def create(cls, name: str, cfg: ServeConfig, device: torch.device) -> AttentionBackend:
        assert name in cls._registry, f"unknown attention backend {name!r}"  # expect: FC109
        return cls._registry[name](cfg, device)

    @abc.abstractmethod
    def init_forward_metadata(self, batch) -> None: ...
    @abc.abstractmethod
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None: ...
    @abc.abstractmethod
    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch) -> None: ...
    @abc.abstractmethod
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer) -> torch.Tensor: ...
    @abc.abstractmethod
    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor, layer) -> torch.Tensor: ...


class _WorkspaceMeta(type):
    kinds: dict[str, type] = {}

    def __new__(mcls, name, bases, ns, kind: Optional[str] = None):
        cls = super().__new__(mcls, name, bases, ns)
        if kind is not None:
            mcls.kinds[kind] = cls
        return cls


class Workspace(metaclass=_WorkspaceMeta):
    def __init__(self, nbytes: int, device: torch.device):
        self.buf = self.allocate(nbytes, device)

    def allocate(self, nbytes: int, device: torch.device) -> torch.Tensor:
        raise NotImplementedError


class ZeroedWorkspace(Workspace, kind="zeroed"):  # trtllm-gen and XQA keep semaphores here
    def allocate(self, nbytes: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


class ScratchWorkspace(Workspace, kind="scratch"):
    def allocate(self, nbytes: int, device: torch.device) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def make_workspace(kind: str, nbytes: int, device: torch.device) -> torch.Tensor:
    return _WorkspaceMeta.kinds[kind](nbytes, device).buf
