"""Greedy / temperature sampling with the grammar mask applied inside the captured graph."""
from __future__ import annotations

import torch
from torch import nn

from jsonmode import JsonModeConfig


class MaskedSampler(nn.Module):
    def __init__(self, cfg: JsonModeConfig, device: torch.device) -> None:
        super().__init__()
        self.vocab_size = cfg.vocab_size
        self.temperature = torch.ones(cfg.max_batch, dtype=torch.float32, device=device)
        self.neg_inf = torch.tensor(float("-inf"), dtype=torch.float32, device=device)
        self.bit_idx = torch.arange(32, dtype=torch.int32, device=device)
        self.sampler_workspace = torch.empty(cfg.max_batch * cfg.vocab_size * 4, dtype=torch.uint8,  # ok: FC106
                                             device=device)

    def forward(self, logits: torch.Tensor, mask_words: torch.Tensor) -> torch.Tensor:
        n, v = logits.shape
        bits = (mask_words.unsqueeze(-1) >> self.bit_idx) & 1
        allowed = bits.flatten(1)[:, :v].bool()
        masked = torch.where(allowed, logits.float(), self.neg_inf)  # ok: FC101
        scaled = self.sampler_workspace[: n * v * 4].view(torch.float32).view(n, v)
        torch.div(masked, self.temperature[:n, None], out=scaled)
        return torch.argmax(scaled, dim=-1)
