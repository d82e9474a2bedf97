"""Graph wrappers around the model, picked per platform and mode from ``qrserve.config.QUALNAMES``.

``CUDAGraphWrapper`` records one graph per padded decode batch size (``record``, called by
``GPUModelRunner.capture_model`` largest size first) and replays it when the step's metadata says the batch was
staged for that size; every other step runs the model eagerly. ``EagerWrapper`` is the ``mode="eager"`` stand-in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from qrserve.config import EngineConfig

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    output: torch.Tensor


class CUDAGraphWrapper:
    def __init__(self, runnable: Callable[..., torch.Tensor], cfg: EngineConfig, device: torch.device):
        self.runnable = runnable
        self.device = device
        self.capture_sizes = tuple(sorted(cfg.cudagraph_capture_sizes))
        self.static_input_ids: Optional[torch.Tensor] = None
        self.static_positions: Optional[torch.Tensor] = None
        self._graphs: dict[int, GraphEntry] = {}
        self._pool: Any = None

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: Any) -> torch.Tensor:
        bs = attn_metadata.padded_bs
        if bs is None or bs not in self._graphs:
            logger.debug("eager step: %d tokens from position %s", input_ids.shape[0], positions[0])  # ok: FC101
            return self.runnable(input_ids, positions, attn_metadata)
        return self.replay(bs, input_ids, positions)

    def replay(self, bs: int, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        assert self._graphs, "capture_model() must run before the first replay"  # ok: FC109
        entry = self._graphs[bs]
        n = input_ids.shape[0]
        logger.debug(f"replaying graph bs={bs} for {n} tokens, last position {positions[n - 1]}")  # expect: FC101
        entry.input_ids[:n].copy_(input_ids)
        entry.positions[:n].copy_(positions)
        entry.graph.replay()
        return entry.output[:n]

    def record(self, bs: int, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: Any) -> None:
        if self.static_input_ids is None or bs > self.static_input_ids.shape[0]:
            # capture_model() records the largest size first: this sizes the inputs once, before any graph exists
            self.static_input_ids = torch.zeros(bs, dtype=input_ids.dtype, device=self.device)  # ok: FC107
            self.static_positions = torch.zeros(bs, dtype=positions.dtype, device=self.device)
        ids = self.static_input_ids[:bs]
        pos = self.static_positions[:bs]
        ids.copy_(input_ids[:bs])
        pos.copy_(positions[:bs])

        # warm-up: JIT compilation and allocator growth stay out of the graph
        self.runnable(ids, pos, attn_metadata)
        torch.cuda.synchronize()  # ok: FC101

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self.runnable(ids, pos, attn_metadata)
        if self._pool is None:
            self._pool = graph.pool()
        self._graphs[bs] = GraphEntry(graph=graph, input_ids=ids, positions=pos, output=out)
        logger.info("captured decode graph for batch size %d", bs)


class EagerWrapper:
    """``mode="eager"``: same call signature, no graphs."""

    def __init__(self, runnable: Callable[..., torch.Tensor], cfg: EngineConfig, device: torch.device):
        self.runnable = runnable
        self.device = device

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: Any) -> torch.Tensor:
        return self.runnable(input_ids, positions, attn_metadata)
