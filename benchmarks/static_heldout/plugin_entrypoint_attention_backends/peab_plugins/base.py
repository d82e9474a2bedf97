"""The interface every attention plugin implements."""
from __future__ import annotations

import abc
from typing import Dict, Optional, Tuple

import torch

from peab.batch import StepBatch
from peab.config import EngineConfig

KVCache = Tuple[torch.Tensor, torch.Tensor]


class AttentionBackend(abc.ABC):
    plugin_name: str = "?"
    supports_cuda_graph: bool = True  # cleared by plugins whose kernels choose launch parameters per call
    kv_layout: str = "NHD"

    def __init__(self, cfg: EngineConfig, layer_type: str, device: torch.device):
        self.cfg = cfg
        self.layer_type = layer_type
        self.device = device
        self._kv_layout = self.kv_layout  # ok: FC103
        self._sm_scale = cfg.head_dim**-0.5  # ok: FC103
        self._plan_info: Dict[str, int] = {}
        self.graph_bs: Optional[int] = None
        self.dims = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)

    def init_graph_state(self, max_bs: int) -> None:
        """Build the graph-mode wrappers and the buffers they bind; eager-only plugins have none."""

    @abc.abstractmethod
    def init_forward_metadata(self, batch: StepBatch) -> None: ...
    @abc.abstractmethod
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None: ...
    @abc.abstractmethod
    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> None: ...
    @abc.abstractmethod
    def forward_decode(self, q: torch.Tensor, kv_cache: KVCache, layer_id: int) -> torch.Tensor: ...
    @abc.abstractmethod
    def forward_extend(self, q, k, v, kv_cache: KVCache, layer_id: int) -> torch.Tensor: ...

    def describe(self) -> str:
        return f"{self.plugin_name}[{self.layer_type}] layout={self._kv_layout} plans={self._plan_info}"  # ok: FC103
