"""Sampling parameters and the staged tensors the captured sampler reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np
import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_n_logprobs: int = 0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    max_tokens: int = 256


@dataclass
class ModelConfig:
    num_layers: int = 24
    hidden_size: int = 2048
    vocab_size: int = 151936
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    max_top_n: int = 20
    max_batch: int = 128
    max_tokens: int = 4096
    buckets: Tuple[int, ...] = field(default_factory=lambda: (1, 2, 4, 8, 16, 32, 64, 128))

    def bucket_for(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)


class SamplingTensors:
    """Per-row parameters: numpy views of pinned staging rows, copied into the device rows."""

    def __init__(self, max_rows: int, device: torch.device):
        self.param_staging = torch.ones(4, max_rows, dtype=torch.float32, pin_memory=True)
        self.param_np = self.param_staging.numpy()
        self.params = torch.ones(4, max_rows, dtype=torch.float32, device=device)
        self.temperature, self.rep_pen, self.freq_pen, self.min_p = self.params.unbind(0)

    def stage(self, params: List[SamplingParams]) -> None:
        n = len(params)
        self.param_np[:, :n] = np.array(
            [[p.temperature, p.repetition_penalty, p.frequency_penalty, p.min_p] for p in params],
            dtype=np.float32,
        ).T
        self.params[:, :n].copy_(self.param_staging[:, :n], non_blocking=True)
