"""Per-request sampling parameters and their per-step batch on the device."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int = 0  # top logprobs to return; > 0 forces the eager sampler
    logit_bias: Optional[dict] = None


@dataclass
class SamplingBatch:
    size: int
    req_ids: List[int]
    slots: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    rep_penalty: torch.Tensor
    presence_penalty: torch.Tensor
    frequency_penalty: torch.Tensor
    logit_bias: Optional[torch.Tensor]
    top_k_np: np.ndarray
    logprobs_np: np.ndarray
    any_penalty_host: bool

    @property
    def needs_logprobs(self) -> bool:
        return bool(self.logprobs_np.any())

    @property
    def max_logprobs(self) -> int:
        return int(self.logprobs_np.max()) if self.size else 0

    @property
    def needs_penalties(self) -> bool:
        penalized = (self.rep_penalty != 1.0) | (self.presence_penalty != 0.0) | (self.frequency_penalty != 0.0)
        return bool(penalized.any())  # expect: FC101

    @classmethod
    def build(cls, params: List[SamplingParams], slots: List[int], req_ids: List[int], vocab: int,
              device: torch.device) -> "SamplingBatch":
        n = len(params)
        temp = np.array([max(p.temperature, 1e-5) for p in params], dtype=np.float32)
        top_k = np.array([p.top_k if 0 < p.top_k < vocab else vocab for p in params], dtype=np.int32)
        top_p = np.array([p.top_p for p in params], dtype=np.float32)
        rep = np.array([p.repetition_penalty for p in params], dtype=np.float32)
        pres = np.array([p.presence_penalty for p in params], dtype=np.float32)
        freq = np.array([p.frequency_penalty for p in params], dtype=np.float32)
        bias = None
        if any(p.logit_bias for p in params):
            dense = np.zeros((n, vocab), dtype=np.float32)
            for i, p in enumerate(params):
                for tok, b in (p.logit_bias or {}).items():
                    dense[i, int(tok)] = float(b)
            bias = torch.from_numpy(dense).to(device, non_blocking=True)
        return cls(
            size=n,
            req_ids=list(req_ids),
            slots=torch.tensor(slots, dtype=torch.int64).to(device, non_blocking=True),
            temperature=torch.from_numpy(temp).to(device, non_blocking=True),
            top_k=torch.from_numpy(top_k).to(device, non_blocking=True),
            top_p=torch.from_numpy(top_p).to(device, non_blocking=True),
            rep_penalty=torch.from_numpy(rep).to(device, non_blocking=True),
            presence_penalty=torch.from_numpy(pres).to(device, non_blocking=True),
            frequency_penalty=torch.from_numpy(freq).to(device, non_blocking=True),
            logit_bias=bias,
            top_k_np=top_k,
            logprobs_np=np.array([p.logprobs for p in params], dtype=np.int32),
            any_penalty_host=bool(np.any(rep != 1.0) or np.any(pres != 0.0) or np.any(freq != 0.0)),
        )
