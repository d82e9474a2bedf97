"""Interface of a KV-class backend."""

from __future__ import annotations

import abc
from typing import Optional

import torch

from qswitch.config import SwitchConfig
from qswitch.dtypes import KVClass
from qswitch.metadata import DecodeMetadata
from qswitch.pool import QuantKVPool
from qswitch.workspaces import WorkspacePool


class KVBackend(abc.ABC):
    kv_class: KVClass

    def __init__(self, cfg: SwitchConfig, pool: QuantKVPool, ws: WorkspacePool, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.ws = ws
        self.device = device
        self.sm_scale = cfg.head_dim ** -0.5
        self.graph_bs: Optional[int] = None

    @abc.abstractmethod
    def init_forward_metadata(self, meta: DecodeMetadata) -> None:
        ...

    @abc.abstractmethod
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        ...

    @abc.abstractmethod
    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: DecodeMetadata) -> None:
        ...

    @abc.abstractmethod
    def forward_decode(self, q: torch.Tensor, layer_id: int, bs: int) -> torch.Tensor:
        ...

    def plan_kwargs(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_q_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, page_size=c.page_size)
