from typing import Optional

import torch
from torch import nn

from .config import EngineConfig


class Sampler(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.max_batch_size = cfg.max_batch_size
        self.vocab_size = cfg.vocab_size
        self.logprobs_buf: Optional[torch.Tensor] = None

    def forward(self, logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
        if self.logprobs_buf is None:
            self.logprobs_buf = torch.empty(self.max_batch_size, dtype=torch.float32, device=logits.device)  # ok: FC107
        bs = logits.shape[0]
        probs = torch.softmax(logits.float() / temperatures.clamp_min(1e-5)[:, None], dim=-1)
        sampled = torch.multinomial(probs, 1).squeeze(-1)
        if (temperatures < 1e-5).any():  # expect: FC101
            sampled = torch.where(temperatures < 1e-5, logits.argmax(-1), sampled)
        torch.log(probs.gather(-1, sampled[:, None]).squeeze(-1), out=self.logprobs_buf[:bs])
        return sampled
