"""Capabilities a backend may have. Backends implement them structurally and never inherit from them."""
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class AttentionImpl(Protocol):
    def forward_decode(self, q: torch.Tensor, layer: Any, meta: Any) -> torch.Tensor: ...
    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, meta: Any) -> torch.Tensor: ...


@runtime_checkable
class SupportsEagerPlan(Protocol):
    def plan_step(self, meta: Any) -> None: ...


@runtime_checkable
class SupportsCudaGraph(Protocol):
    def init_cuda_graph_state(self, max_bs: int) -> None: ...
    def init_forward_metadata_capture_cuda_graph(self, bs: int, meta: Any) -> None: ...
    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: Any) -> None: ...


@runtime_checkable
class SupportsCascade(Protocol):
    def plan_cascade(self, meta: Any) -> None: ...
    def shared_prefix_pages(self) -> int: ...
