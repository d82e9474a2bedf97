"""The interface every attention backend plugin implements."""

from __future__ import annotations

import abc
from typing import Sequence

import torch

from ..batch import StepInputs
from ..config import EngineConfig


class AttentionBackend(abc.ABC):
    name: str = "base"
    supports_cuda_graph: bool = True

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.sm_scale = cfg.head_dim ** -0.5
        self.kv_dtype = torch.bfloat16
        self.q_dtype = torch.bfloat16

    @abc.abstractmethod
    def init_forward_metadata(self, batch: StepInputs) -> None:
        """Plan the eager path for this step."""

    @abc.abstractmethod
    def init_cuda_graph_state(self, buckets: Sequence[int]) -> None:
        """Allocate the buffers captured graphs read."""

    @abc.abstractmethod
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        """Plan dummy metadata before bucket ``bs`` is captured."""

    @abc.abstractmethod
    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepInputs) -> None:
        """Refresh the bucket's graph-read buffers and plan before a replay."""

    @abc.abstractmethod
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        ...

    @abc.abstractmethod
    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        ...

    def describe(self) -> str:
        return self.name
