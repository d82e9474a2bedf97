"""Abstract attention backend. Concrete backends register under a name when their class is created."""

from __future__ import annotations

import abc
from typing import ClassVar, Dict, Optional, Type

import torch

from ccbi.config import PAGE_SIZE, EngineConfig
from ccbi.forward_batch import ForwardBatch


class AttentionBackend(abc.ABC):
    registry: ClassVar[Dict[str, Type["AttentionBackend"]]] = {}
    name: ClassVar[str] = ""

    def __init_subclass__(cls, name: str = "", **kwargs):
        super().__init_subclass__(**kwargs)
        if name:
            assert name not in AttentionBackend.registry, f"backend {name} registered twice"  # expect: FC109
            cls.name = name
            AttentionBackend.registry[name] = cls

    def __init__(self, cfg: EngineConfig, device: torch.device, shared_ws: torch.Tensor):
        self.cfg, self.device, self.shared_ws = cfg, device, shared_ws
        self._kv_layout = "NHD"
        self._backend = type(self).name
        self.kv_cache: Optional[torch.Tensor] = None
        self.req_to_page: Optional[torch.Tensor] = None
        self.graph_wrappers: Dict[int, object] = {}
        self.graph_bufs: Dict[str, torch.Tensor] = {}

    @classmethod
    def create(cls, cfg: EngineConfig, device: torch.device, shared_ws: torch.Tensor) -> "AttentionBackend":
        backend_cls = cls.registry.get(cfg.attention_backend)
        if backend_cls is None:
            raise ValueError(f"unknown attention backend {cfg.attention_backend!r}; registered: {sorted(cls.registry)}")
        return backend_cls(cfg, device, shared_ws)

    def bind_kv_cache(self, kv_cache: torch.Tensor, req_to_page: torch.Tensor) -> None:
        self.kv_cache, self.req_to_page = kv_cache, req_to_page

    def save_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        cache, page, slot = self.kv_cache[layer_id], loc // PAGE_SIZE, loc % PAGE_SIZE
        cache[page, 0, slot] = k
        cache[page, 1, slot] = v

    def reset_padding(self) -> None:
        """Run after aborted requests; backends without graph state keep nothing to reset."""

    @abc.abstractmethod
    def init_cuda_graph_state(self, max_bs: int) -> None: ...
    @abc.abstractmethod
    def init_forward_metadata(self, fb: ForwardBatch) -> None: ...
    @abc.abstractmethod
    def init_forward_metadata_capture_cuda_graph(self, bs: int, seq_lens_cpu: torch.Tensor, req_pool_indices: torch.Tensor) -> None: ...
    @abc.abstractmethod
    def init_forward_metadata_replay_cuda_graph(self, bs: int, seq_lens_cpu: torch.Tensor, req_pool_indices: torch.Tensor) -> None: ...
    @abc.abstractmethod
    def forward(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor: ...
    @abc.abstractmethod
    def forward_decode(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor: ...
    @abc.abstractmethod
    def forward_extend(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor: ...
