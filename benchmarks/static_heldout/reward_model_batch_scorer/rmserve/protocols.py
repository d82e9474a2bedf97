"""Interfaces the server depends on without importing their implementations."""

from __future__ import annotations

import contextlib
from typing import Protocol

import torch


class ScoreHead(Protocol):
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        ...


class PolicyHandle(Protocol):
    """The policy model living on the same GPU (owned by the trainer process)."""

    def yield_gpu(self) -> contextlib.AbstractContextManager:
        ...

    def set_attention_workspace(self, workspace: torch.Tensor) -> None:
        ...
