"""Temperature sampling shared by the chat tenants."""
from __future__ import annotations

from typing import Optional

import torch
from flashinfer.sampling import sampling_from_probs


class ColoSampler:
    MAX_ROWS = 256

    def __init__(self, device: torch.device, max_vocab: int):
        self.device = device
        self.max_vocab = max_vocab
        self.temperatures = torch.ones(self.MAX_ROWS, dtype=torch.float32, device=device)
        self._probs_buf: Optional[torch.Tensor] = None

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        bs, vocab = logits.shape
        if getattr(self, "_probs_buf", None) is None:
            self._probs_buf = torch.empty((self.MAX_ROWS, self.max_vocab), dtype=torch.float32, device=self.device)  # ok: FC107
        probs = self._probs_buf[:bs, :vocab]
        torch.softmax(logits.float() / self.temperatures[:bs, None], dim=-1, out=probs)
        return sampling_from_probs(probs)
