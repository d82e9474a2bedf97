"""Sampler behind its own middleware stack (timer, logging, kwargs defaults)."""

from __future__ import annotations

from typing import Optional

import torch

from kwstack.forward_batch import ForwardBatch
from kwstack.middleware import build_step_stack


class Sampler:
    def __init__(self, eos_id: int, max_bs: int, min_new_tokens: int = 0, device: str = "cuda"):
        self.eos_id = eos_id
        self.min_new_tokens = min_new_tokens
        self.device = torch.device(device)
        self.num_eos_steps = 0
        self.pinned_next = torch.empty(max_bs, dtype=torch.int64, pin_memory=True)
        self.copy_done = torch.cuda.Event()
        self.stack = build_step_stack(self._sample_core, every=200, tag="sample")

    def sample(self, logits: torch.Tensor, fb: ForwardBatch, **kwargs) -> torch.Tensor:
        return self.stack(fb, logits=logits, **kwargs)

    def _sample_core(self, fb: ForwardBatch, logits: Optional[torch.Tensor] = None, **kwargs) -> torch.Tensor:
        if logits is None or logits.shape[0] != fb.batch_size:
            raise ValueError(f"sampler got {None if logits is None else logits.shape} for seq_lens={fb.seq_lens}")  # ok: FC101
        temperatures = kwargs.get("temperatures")
        too_short = fb.seq_lens < self.min_new_tokens
        logits[too_short, self.eos_id] = float("-inf")  # ok: FC101
        greedy_ids = torch.argmax(logits, dim=-1)
        if temperatures is None:
            next_ids = greedy_ids
        else:
            probs = torch.softmax(logits / temperatures.clamp(min=1e-5).unsqueeze(-1), dim=-1)
            sampled = torch.multinomial(probs, num_samples=1).squeeze(-1)
            next_ids = torch.where(temperatures == 0, greedy_ids, sampled)  # ok: FC101
        if (next_ids == self.eos_id).any():  # expect: FC101
            self.num_eos_steps += 1
        if fb.batch_size > self.pinned_next.shape[0]:
            self.pinned_next = torch.empty(fb.batch_size * 2, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.pinned_next[: fb.batch_size].copy_(next_ids, non_blocking=True)  # ok: FC101
        self.copy_done.record()
        return next_ids
