"""Sampling from per-request parameter tuples.

``params`` holds one ``(temperature, top_p, top_k, min_new_tokens, generated)``
tuple per row of the step; the sampler transposes them with ``zip(*params)``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from flashinfer.sampling import top_k_renorm_probs, top_p_sampling_from_probs

from .config import EngineConfig


class TupleSampler:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.device = device
        self.vocab_size = cfg.vocab_size
        self.eos_id = cfg.eos_token_id
        self.max_bs = cfg.max_batch_size
        self.greedy_buf: Optional[torch.Tensor] = None

    def _to_device(self, values: Sequence, dtype: torch.dtype) -> torch.Tensor:
        host = torch.tensor(values, dtype=dtype, pin_memory=True)
        return host.to(self.device, non_blocking=True)

    def __call__(self, logits: torch.Tensor, params: Sequence[tuple]) -> torch.Tensor:
        bs = logits.shape[0]
        temps, top_ps, top_ks, min_new, generated = zip(*params)

        # keep EOS out of reach until a request has produced its minimum
        generated_d = self._to_device(generated, torch.int32)
        min_new_d = self._to_device(min_new, torch.int32)
        too_short = generated_d < min_new_d
        logits[too_short, self.eos_id] = float("-inf")  # ok: FC101

        if self.greedy_buf is None:
            self.greedy_buf = torch.empty(self.max_bs, dtype=torch.int64, device=self.device)  # ok: FC107
        greedy_ids = torch.argmax(logits, dim=-1, out=self.greedy_buf[:bs])
        if all(t == 0.0 for t in temps):  # ok: FC101
            return greedy_ids

        temps_d = self._to_device(temps, torch.float32)
        top_p_d = self._to_device(top_ps, torch.float32)
        top_k_d = self._to_device(top_ks, torch.int32)
        probs = torch.softmax(logits.float() / temps_d.clamp(min=1e-5).unsqueeze(-1), dim=-1)
        if top_k_d.max() > 0:  # expect: FC101
            probs = top_k_renorm_probs(probs, torch.where(top_k_d > 0, top_k_d, self.vocab_size))
        sampled = top_p_sampling_from_probs(probs, top_p_d).long()
        return torch.where(temps_d == 0, greedy_ids, sampled)  # ok: FC101
