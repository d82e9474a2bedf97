"""Decode graphs per bucket: model forward plus the masked sampler."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from jm_attn.backend import JsonBackend
from jsonmode import BitmaskBuilder, JsonModeConfig

from .model import QwenJson
from .sampler import MaskedSampler

logger = logging.getLogger(__name__)


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor


class JsonGraphRunner:
    _STATIC_INPUTS = ("input_ids", "positions")

    def __init__(self, model: QwenJson, sampler: MaskedSampler, backend: JsonBackend, bitmask: BitmaskBuilder,
                 cfg: JsonModeConfig, device: torch.device) -> None:
        self.model = model
        self.sampler = sampler
        self.backend = backend
        self.bitmask = bitmask
        self.buckets = sorted(cfg.buckets)
        self.input_ids = torch.zeros(cfg.max_batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(cfg.max_batch, dtype=torch.long, device=device)
        self.out_tokens = torch.zeros(cfg.max_batch, dtype=torch.long, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.capture_stream = torch.cuda.Stream(device)

    def bucket_for(self, bs: int) -> Optional[int]:
        return next((b for b in self.buckets if b >= bs), None)

    def _forward(self, bs: int, kv_cache: torch.Tensor) -> torch.Tensor:
        logits = self.model(self.input_ids[:bs], self.positions[:bs], kv_cache)
        return self.sampler(logits, self.bitmask.mask_device[:bs])

    def capture_one_batch_size(self, bs: int, kv_cache: torch.Tensor) -> None:
        self.backend.plan_capture(bs)
        with torch.cuda.stream(self.capture_stream):
            for _ in range(2):
                out = self._forward(bs, kv_cache)
            self.capture_stream.synchronize()  # ok: FC101
            logger.info(f"captured json-mode decode bs={bs}, warm-up token {out[0]}")  # expect: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=self.capture_stream):
                self.out_tokens[:bs] = self._forward(bs, kv_cache)
        self.graphs[bs] = g

    def replay(self, bs: int, inputs: StepInputs) -> torch.Tensor:
        for name in self._STATIC_INPUTS:
            setattr(self, name, getattr(inputs, name).clone())  # expect: FC107
        self.graphs[bs].replay()
        return self.out_tokens[:bs]
