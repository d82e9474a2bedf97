from __future__ import annotations

from typing import Optional

import torch


class Sampler:
    """Greedy for temperature 0, else Gumbel-max through exponential noise (no
    host round trip)."""

    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        self.device = device
        self.temperature = torch.ones(max_num_reqs, dtype=torch.float32, device=device)
        self._noise: Optional[torch.Tensor] = None

    def __call__(self, logits: torch.Tensor, all_greedy: bool) -> torch.Tensor:
        n = logits.shape[0]
        if all_greedy:
            return logits.argmax(dim=-1)
        if self._noise is None:
            self._noise = torch.empty(self.max_num_reqs, self.vocab_size, dtype=torch.float32, device=self.device)  # ok: FC107
        probs = torch.softmax(logits / self.temperature[:n, None], dim=-1)
        q = self._noise[:n].exponential_()
        return probs.div_(q).argmax(dim=-1)
