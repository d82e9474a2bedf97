"""A small byte LM whose next-byte entropy decides where patches start."""
from __future__ import annotations

import torch
from torch import nn


class EntropyModel(nn.Module):
    def __init__(self, num_byte_tokens: int, dim: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_byte_tokens, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, num_byte_tokens)

    def forward(self, byte_ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.embed(byte_ids))
        logp = torch.log_softmax(self.head(h).float(), dim=-1)
        return -(logp.exp() * logp).sum(dim=-1)


class EntropyPatcher:
    """Marks a patch start where the entropy model is surprised."""

    def __init__(self, model: EntropyModel, threshold: float, max_patch_len: int) -> None:
        assert max_patch_len > 0, "patches need at least one byte"  # expect: FC109
        self.model = model
        self.threshold = threshold
        self.max_patch_len = max_patch_len

    @torch.no_grad()
    def boundaries(self, byte_ids: torch.Tensor) -> torch.Tensor:
        ent = self.model(byte_ids)
        starts = ent > self.threshold
        starts[:, 0] = True
        pos = torch.arange(byte_ids.shape[1], device=byte_ids.device)
        forced = (pos % self.max_patch_len) == 0
        return torch.where(forced.unsqueeze(0), torch.ones_like(starts), starts)
