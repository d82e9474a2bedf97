"""Marlin GEMM over AWQ weights, and the warm-up autotuner that picks tile configs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple

import torch
from torch import nn

from awq.loader import MarlinWeights


@dataclass(frozen=True)
class GemmConfig:
    thread_k: int
    thread_n: int
    num_stages: int


DEFAULT_CONFIG = GemmConfig(128, 128, 4)
CANDIDATES: Tuple[GemmConfig, ...] = (
    GemmConfig(128, 128, 4),
    GemmConfig(64, 256, 4),
    GemmConfig(128, 64, 3),
    GemmConfig(64, 128, 2),
)
TuneKey = Tuple[int, int, int]


class MarlinLinear(nn.Module):
    def __init__(self, weights: MarlinWeights):
        super().__init__()
        self.weights = weights
        self.in_features = weights.meta.in_features
        self.out_features = weights.meta.out_features
        # per-tile locks for the stream-K reduction; Marlin resets them itself after each call
        self.locks = torch.zeros(
            max(1, self.out_features // 64) * 16, dtype=torch.int32, device=weights.qweight.device
        )
        self.config: Optional[GemmConfig] = None

    def gemm(self, x: torch.Tensor, cfg: Optional[GemmConfig] = None) -> torch.Tensor:
        cfg = cfg or self.config or DEFAULT_CONFIG
        w = self.weights
        return torch.ops._C.awq_marlin_gemm(
            x, w.qweight, w.scales, w.qzeros, self.locks, x.shape[0], self.out_features,
            self.in_features, cfg.thread_k, cfg.thread_n, cfg.num_stages,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm(x)


class MarlinAutotuner:
    """Times each candidate config per (m, k, n) once, during warm-up."""

    def __init__(self, device: torch.device, iters: int = 20):
        self.device = device
        self.iters = iters
        self.best: Dict[TuneKey, GemmConfig] = {}

    def tune(self, layer: MarlinLinear, m_values: Iterable[int]) -> None:
        for m in m_values:
            key = (m, layer.in_features, layer.out_features)
            if key in self.best:
                layer.config = self.best[key]
                continue
            x = torch.randn(m, layer.in_features, dtype=torch.float16, device=self.device)
            timings = []
            for cand in CANDIDATES:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(self.iters):
                    layer.gemm(x, cand)
                end.record()
                torch.cuda.synchronize()  # ok: FC101
                timings.append(start.elapsed_time(end))
            self.best[key] = CANDIDATES[timings.index(min(timings))]
            layer.config = self.best[key]
