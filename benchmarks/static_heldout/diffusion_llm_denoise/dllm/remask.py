"""Low-confidence remasking (LLaDA): each step unmasks the most confident predictions."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch


def transfer_schedule(mask_counts_cpu: torch.Tensor, steps: int) -> torch.Tensor:
    """How many tokens each row unmasks at every step: an even split, remainder first."""
    counts = mask_counts_cpu.numpy().astype(np.int64)
    base, rem = counts // steps, counts % steps
    sched = np.repeat(base[:, None], steps, axis=1)
    sched[np.arange(steps)[None, :] < rem[:, None]] += 1
    return torch.from_numpy(sched)


class Remasker:
    def __init__(self, mask_id: int, steps: int, max_bs: int, max_block_len: int, device: torch.device,
                 temperature: float = 0.0):
        self.mask_id = mask_id
        self.steps = steps
        self.max_bs = max_bs
        self.max_block_len = max_block_len
        self.device = device
        self.temperature = temperature
        self.conf_scratch: Optional[torch.Tensor] = None

    def schedule(self, mask_counts_cpu: torch.Tensor) -> torch.Tensor:
        return transfer_schedule(mask_counts_cpu, self.steps)

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        if self.temperature == 0.0:
            return torch.argmax(logits, dim=-1)
        # Gumbel-max in fp64, as the reference sampler does
        noise = torch.rand_like(logits, dtype=torch.float64)
        gumbel = (-torch.log(noise)) ** self.temperature
        return torch.argmax(logits.double().exp() / gumbel, dim=-1)

    def remask(self, x: torch.Tensor, logits: torch.Tensor, num_transfer: torch.Tensor, step: int) -> torch.Tensor:
        """x: [bs, L] tokens of the block, logits: [bs, L, vocab]; returns the next x."""
        bs, block_len = x.shape
        masked = x == self.mask_id
        x0 = self._sample(logits)
        p = torch.softmax(logits.float(), dim=-1)
        conf = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)
        if self.conf_scratch is None:
            self.conf_scratch = torch.empty(self.max_bs, self.max_block_len, device=self.device)  # ok: FC107
        conf_buf = self.conf_scratch[:bs, :block_len]
        torch.where(masked, conf, torch.full_like(conf, float("-inf")), out=conf_buf)
        x0 = torch.where(masked, x0, x)
        transfer = torch.zeros_like(masked)
        for b in range(bs):
            k = int(num_transfer[b, step])  # expect: FC101
            transfer[b, torch.topk(conf_buf[b], k).indices] = True
        return torch.where(transfer, x0, x)
