from __future__ import annotations

import logging
from typing import Dict, List, Tuple

import torch

from longrope.attn_backend import DecodeInputs, DualRegimeBackend
from longrope.config import EngineConfig
from longrope.model import LongRopeModel

logger = logging.getLogger(__name__)


class RegimeGraphRunner:
    """Decode graphs per (regime, batch size)."""

    _STATIC_INPUTS = ("input_ids", "positions")

    def __init__(self, cfg: EngineConfig, model: LongRopeModel, backend: DualRegimeBackend,
                 kv_caches: List[torch.Tensor], device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.device = device
        self.input_ids = torch.zeros(cfg.max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(cfg.max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[Tuple[str, int], torch.cuda.CUDAGraph] = {}
        self.logits: Dict[Tuple[str, int], torch.Tensor] = {}

    def capture_all(self) -> None:
        self.backend.init_cuda_graph_state()
        pool = torch.cuda.graph_pool_handle()
        for regime in ("short", "long"):
            for bs in reversed(self.cfg.graph_batch_sizes):
                self.capture_one_batch_size(regime, bs, pool)

    def capture_one_batch_size(self, regime: str, bs: int, pool) -> None:
        start = self.cfg.original_max + 1 if regime == "long" else 0
        self.positions[:bs].copy_(torch.arange(start, start + bs))
        if self.positions[:bs].max().item() > self.cfg.max_position:  # expect: FC101
            raise ValueError(f"bs={bs} does not fit below max_position={self.cfg.max_position}")
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        self.model(self.input_ids[:bs], self.positions[:bs], self.kv_caches, regime, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            self.logits[(regime, bs)] = self.model(self.input_ids[:bs], self.positions[:bs], self.kv_caches,
                                                   regime, bs)
        self.graphs[(regime, bs)] = g

    def pick(self, n: int) -> int:
        for bs in self.cfg.graph_batch_sizes:
            if bs >= n:
                return bs
        return -1

    def replay(self, regime: str, bs: int, step: "StepInputs", inp: DecodeInputs) -> torch.Tensor:
        n = step.input_ids.shape[0]
        for name in self._STATIC_INPUTS:
            setattr(self, name, getattr(step, name).clone())  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, inp)
        self.graphs[(regime, bs)].replay()
        return self.logits[(regime, bs)][:n]
