"""Sampling: a static, graph-capturable Gumbel sampler and an eager one with logprobs."""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import torch
from flashcheck import hot_path

from .rng import gumbel_from_uniform, philox_uniform


class GraphSampler:
    """Everything here is capture-safe: fixed shapes, no host reads.

    Unseeded rows draw a fresh seed from `generator` each step; the generator is
    registered with every captured graph so replays advance its philox state.
    """

    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(0x5EED)

    def sample(
        self,
        logits: torch.Tensor,
        temps: torch.Tensor,
        seeds: torch.Tensor,
        offsets: torch.Tensor,
        seeded: torch.Tensor,
    ) -> torch.Tensor:
        fresh = torch.randint(
            0, 2**62, seeds.shape, generator=self.generator, device=logits.device, dtype=torch.int64
        )
        row_seeds = torch.where(seeded, seeds, fresh)  # ok: FC101
        u = philox_uniform(row_seeds, offsets, self.vocab_size)
        scaled = logits.float() / temps.clamp_min(1e-5)[:, None]
        sampled = torch.argmax(scaled + gumbel_from_uniform(u), dim=-1)
        greedy = torch.argmax(logits, dim=-1)
        offsets.add_(1)
        return torch.where(temps > 0, sampled, greedy)


class EagerLogprobSampler:
    """Batches with a logprobs request run eagerly: same noise, plus top-k logprobs."""

    def __init__(self, max_bs: int, max_logprobs: int, device: torch.device, use_flashinfer: bool = False):
        self.device = device
        self._backend = "flashinfer" if use_flashinfer else "torch"
        self.lp_pinned = torch.zeros(max_bs, max_logprobs, dtype=torch.float32, pin_memory=True)
        self.ids_pinned = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)

    def _probs_sample(self, logits: torch.Tensor, temps: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        if self._backend == "flashinfer":  # ok: FC103
            import flashinfer.sampling as fs

            probs = torch.softmax(logits.float() / temps.clamp_min(1e-5)[:, None], dim=-1)
            return fs.sampling_from_probs(probs, deterministic=True).long()
        scaled = logits.float() / temps.clamp_min(1e-5)[:, None]
        return torch.argmax(scaled + gumbel_from_uniform(u), dim=-1)

    @hot_path
    def sample_with_logprobs(
        self,
        logits: torch.Tensor,
        temps: torch.Tensor,
        seeds: torch.Tensor,
        offsets: torch.Tensor,
        num_logprobs_np: np.ndarray,
    ) -> Tuple[torch.Tensor, List[List[float]]]:
        n = logits.shape[0]
        u = philox_uniform(seeds, offsets, logits.shape[-1])
        sampled = self._probs_sample(logits, temps, u)
        ids = torch.where(temps > 0, sampled, torch.argmax(logits, dim=-1))
        k = max(int(num_logprobs_np.max()), 1)
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        top = logprobs.topk(k, dim=-1)
        self.lp_pinned[:n, :k].copy_(top.values, non_blocking=True)
        rows = self.lp_pinned[:n, :k].tolist()  # expect: FC101
        return ids, [row[:m] for row, m in zip(rows, num_logprobs_np)]
