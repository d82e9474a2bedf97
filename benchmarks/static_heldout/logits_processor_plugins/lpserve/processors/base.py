"""Base classes of the two processor kinds."""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, List

import torch

if TYPE_CHECKING:
    from lpserve.attn.decode import DecodeAttention
    from lpserve.batch import StepBatch
    from lpserve.config import ServeConfig


class LogitsProcessorBase:
    runs_in_graph = False
    plugin_name = "?"

    def __init__(self, cfg: "ServeConfig", device: torch.device, attn: "DecodeAttention"):
        self.cfg = cfg
        self.device = device
        self.attn = attn
        # buffers the decode graphs read are sized to the largest bucket
        self.max_rows = max(cfg.graph_buckets)

    def add_request(self, rid: int, req) -> None:
        """Per-request set-up (called once on admission)."""

    def release(self, rid: int) -> None:
        """Drop per-request state."""

    def on_tokens(self, rids: List[int], tokens: List[int]) -> None:
        """Sampled tokens, delivered on the output thread after each step."""


class HostLogitsProcessor(LogitsProcessorBase, abc.ABC):
    """Runs on the host before each step and writes into the step's additive bias."""

    @abc.abstractmethod
    def apply_host(self, batch: "StepBatch", bias: torch.Tensor) -> None: ...


class GraphLogitsProcessor(LogitsProcessorBase, abc.ABC):
    """Recorded into the decode graph; ``prepare_step`` stages its inputs before the replay."""

    runs_in_graph = True

    def prepare_step(self, batch: "StepBatch") -> None:
        """Host-side staging before the replay (default: nothing)."""

    @abc.abstractmethod
    def apply_graph(self, logits: torch.Tensor, bs: int) -> torch.Tensor: ...
