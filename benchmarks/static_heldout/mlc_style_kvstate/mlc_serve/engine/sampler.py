"""Sampling with FlashInfer's renorm kernels (temperature, top-p, top-k), greedy rows mixed in."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List

import torch
from flashinfer.sampling import sampling_from_probs, top_k_renorm_probs, top_p_renorm_probs


@dataclass
class SamplingBatch:
    temperatures: List[float]
    top_ps: List[float]
    top_ks: List[int]
    device: torch.device

    @functools.cached_property
    def temperature_gpu(self) -> torch.Tensor:
        return torch.tensor(self.temperatures, dtype=torch.float32, device=self.device)

    @functools.cached_property
    def top_p_gpu(self) -> torch.Tensor:
        return torch.tensor(self.top_ps, dtype=torch.float32, device=self.device)

    @functools.cached_property
    def top_k_gpu(self) -> torch.Tensor:
        return torch.tensor(self.top_ks, dtype=torch.int32, device=self.device)

    @property
    def all_greedy(self) -> bool:
        return all(t == 0.0 for t in self.temperatures)

    @property
    def need_top_p(self) -> bool:
        return any(p < 1.0 for p in self.top_ps)


class Sampler:
    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        if batch.all_greedy:  # ok: FC101
            return logits.argmax(dim=-1)
        temps = batch.temperature_gpu
        greedy = temps == 0.0
        probs = torch.softmax(logits / torch.where(greedy, 1.0, temps).unsqueeze(-1), dim=-1)  # ok: FC101
        if batch.need_top_p:
            probs = top_p_renorm_probs(probs, batch.top_p_gpu)
        if (batch.top_k_gpu > 0).any():  # expect: FC101
            probs = top_k_renorm_probs(probs, batch.top_k_gpu)
        samples = sampling_from_probs(probs)
        return torch.where(greedy, logits.argmax(dim=-1), samples)
