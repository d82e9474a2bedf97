"""Sampling with FlashInfer's renorm and sampling kernels and per-row seeded noise."""

from typing import Optional

import flashinfer
import torch

from fsample.params import StagedParams
from fsample.rows import seeded_uniform


class GraphSampler:
    def __init__(self, vocab_size: int, max_rows: int, device: torch.device):
        self.vocab_size = vocab_size
        self.max_rows = max_rows
        self.device = device
        self.eager_tokens: Optional[torch.Tensor] = None

    def needs_renorm(self, params: StagedParams) -> bool:
        return bool((params.top_k < self.vocab_size).any())  # expect: FC101

    def sample(self, logits, temperature, top_k, top_p, seeds, offsets, renorm: bool) -> torch.Tensor:
        greedy = temperature <= 0
        temp = torch.where(greedy, torch.ones_like(temperature), temperature)  # ok: FC101
        probs = torch.softmax(logits.float() / temp.unsqueeze(-1), dim=-1)
        if renorm:
            probs = flashinfer.sampling.top_k_renorm_probs(probs, top_k)
            probs = flashinfer.sampling.top_p_renorm_probs(probs, top_p)
        gumbel = -torch.log(-torch.log(seeded_uniform(seeds, offsets, self.vocab_size)))
        sampled = torch.argmax(torch.log(probs) + gumbel, dim=-1)
        return torch.where(greedy, logits.argmax(dim=-1), sampled)

    def sample_eager(self, logits: torch.Tensor, params: StagedParams) -> torch.Tensor:
        n = params.num_rows
        if self.eager_tokens is None:
            self.eager_tokens = torch.empty(self.max_rows, dtype=torch.int64, device=self.device)  # ok: FC107
        if params.any_seeded:
            tokens = self.sample(
                logits, params.temperature, params.top_k, params.top_p, params.seeds, params.offsets, renorm=True
            )
        else:
            probs = torch.softmax(logits.float() / params.temperature.clamp_min(1e-5).unsqueeze(-1), dim=-1)
            tokens = flashinfer.sampling.top_k_top_p_sampling_from_probs(
                probs, params.top_k, params.top_p, filter_apply_order="joint", deterministic=True
            )
        self.eager_tokens[:n].copy_(tokens)
        return self.eager_tokens[:n]
