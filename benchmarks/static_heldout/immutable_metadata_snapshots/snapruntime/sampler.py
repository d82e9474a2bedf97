"""Temperature / top-k / top-p sampling with Gumbel noise (no host round trip on the happy path)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from snapserve.batch import Request
from snapserve.config import EngineConfig


@dataclass
class SamplingMetadata:
    temperatures: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    top_k_max: int
    all_greedy: bool
    no_top_p: bool
    generators: Dict[int, torch.Generator] = field(default_factory=dict)

    @classmethod
    def from_requests(cls, reqs: List[Request], device: torch.device) -> "SamplingMetadata":
        temps = [r.temperature for r in reqs]
        top_p = [r.top_p for r in reqs]
        top_k = [r.top_k for r in reqs]
        return cls(
            temperatures=torch.tensor(temps, dtype=torch.float32).pin_memory().to(device, non_blocking=True),
            top_p=torch.tensor(top_p, dtype=torch.float32).pin_memory().to(device, non_blocking=True),
            top_k=torch.tensor(top_k, dtype=torch.int32).pin_memory().to(device, non_blocking=True),
            top_k_max=max(top_k, default=0),
            all_greedy=all(t == 0.0 for t in temps),
            no_top_p=all(p >= 1.0 for p in top_p),
        )


class Sampler:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.noise: Optional[torch.Tensor] = None

    def sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        m = copy.copy(meta)
        if m.all_greedy:  # ok: FC101
            return logits.argmax(dim=-1)
        greedy_rows = m.temperatures < 1e-5
        greedy_tokens = logits.argmax(dim=-1)
        m.temperatures = torch.where(greedy_rows, torch.ones_like(m.temperatures), m.temperatures)
        logits = logits / m.temperatures.unsqueeze(1)
        if (m.top_k > 0).any():  # expect: FC101
            logits = self._top_k(logits, m.top_k, m.top_k_max)
        probs = torch.softmax(logits, dim=-1)
        if not m.no_top_p:
            probs = self._top_p(probs, m.top_p)
        return torch.where(greedy_rows, greedy_tokens, self._gumbel(probs))

    def _top_k(self, logits: torch.Tensor, top_k: torch.Tensor, k_max: int) -> torch.Tensor:
        k_max = max(1, min(k_max, logits.shape[-1]))
        top_vals = logits.topk(k_max, dim=-1).values
        kth = top_vals.gather(1, (top_k.clamp(min=1, max=k_max) - 1).long().unsqueeze(1))
        keep_all = (top_k <= 0).unsqueeze(1)
        return logits.masked_fill((logits < kth) & ~keep_all, float("-inf"))

    def _top_p(self, probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(dim=-1)
        drop = (cum - sorted_p) > top_p.unsqueeze(1)
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        return torch.zeros_like(probs).scatter_(-1, order, sorted_p)

    def _gumbel(self, probs: torch.Tensor) -> torch.Tensor:
        if self.noise is None:
            self.noise = torch.empty(self.cfg.max_num_reqs, self.cfg.vocab_size, device=self.device)  # ok: FC107
        noise = self.noise[: probs.shape[0]].exponential_()
        return (probs / noise).argmax(dim=-1)
