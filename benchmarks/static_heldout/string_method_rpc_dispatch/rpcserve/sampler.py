"""Sampler: picks its sampling routine by name from the batch's host flags."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import EngineConfig
from .forward_batch import SamplingMetadata


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # device
    token_ids_cpu: torch.Tensor  # pinned; valid once copy_event has completed
    copy_event: torch.cuda.Event


class Sampler:
    KINDS = ("greedy", "random", "mixed")

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.device = device
        self.vocab_size = cfg.vocab_size
        self.max_num_seqs = cfg.max_num_seqs
        self._pinned_ids = torch.empty(cfg.max_num_seqs, dtype=torch.int64, pin_memory=True)
        self._exp_buf: torch.Tensor | None = None

    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        kind = "greedy" if meta.all_greedy else ("random" if meta.all_random else "mixed")
        ids = getattr(self, f"_sample_{kind}")(logits, meta)
        n = ids.shape[0]
        out = SamplerOutput(ids, self._pinned_ids[:n], torch.cuda.Event())
        out.token_ids_cpu.copy_(ids, non_blocking=True)  # ok: FC101
        out.copy_event.record()
        return out

    def _sample_greedy(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        return logits.argmax(dim=-1)

    def _sample_random(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        if self._exp_buf is None:
            self._exp_buf = torch.empty(self.max_num_seqs, self.vocab_size, dtype=torch.float32, device=self.device)  # ok: FC107
        temps = meta.temperatures.clamp(min=1e-5).unsqueeze(1)
        probs = torch.softmax(logits.float() / temps, dim=-1)
        # Gumbel-max through exponential races: argmax(p / E), E ~ Exp(1)
        noise = self._exp_buf[: logits.shape[0]].exponential_()
        return probs.div_(noise).argmax(dim=-1)

    def _sample_mixed(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)
        num_random = int((meta.temperatures > 0).sum())  # expect: FC101
        if num_random == 0:
            return greedy
        sampled = self._sample_random(logits, meta)
        return torch.where(meta.temperatures == 0, greedy, sampled)  # ok: FC101
