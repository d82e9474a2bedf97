"""Greedy / temperature sampling.  ``sample`` runs inside the captured decode graph; ``prepare`` and
``finalize`` run eagerly every step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional

import torch


@dataclass
class SamplerOutput:
    tokens_host: torch.Tensor
    ready: torch.cuda.Event
    finished_rows: torch.Tensor
    logprobs: Optional[List[float]] = None


class Sampler:
    def __init__(self, cfg: Mapping[str, Any], device: torch.device):
        s = {"temperature": 1.0, "eos_token_id": 2, "stop_token_ids": [], **cfg.get("sampling", {})}
        hot = {"return_logprobs": False, **cfg.get("hot_path", {})}
        max_bs = cfg.get("scheduler", {}).get("max_batch_size", 64)
        self.sampling_cfg = s
        self.return_logprobs = hot["return_logprobs"]
        self.device = device
        self.eos = s["eos_token_id"]
        self.temperatures = torch.ones(max_bs, dtype=torch.float32, device=device)
        self.row_ids = torch.arange(max_bs, device=device)
        self.last_logprobs = torch.zeros(max_bs, dtype=torch.float32, device=device)
        self.tokens_host = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.stop_ids: Optional[torch.Tensor] = None

    def prepare(self, batch) -> None:
        bs = len(batch.requests)
        self.temperatures = torch.full(  # expect: FC107
            (bs,), self.sampling_cfg.get("temperature", 1.0), dtype=torch.float32, device=self.device
        )
        if self.stop_ids is None:
            stops = self.sampling_cfg.get("stop_token_ids") or [self.eos]
            self.stop_ids = torch.tensor(stops, dtype=torch.int64, device=self.device)  # ok: FC107

    def sample(self, logits: torch.Tensor, bs: int) -> torch.Tensor:
        temps = self.temperatures[:bs]
        if (temps <= 0).all():  # expect: FC101
            # every row greedy (sampling.temperature = 0 in the config): skip the softmax
            tokens = torch.argmax(logits[:bs], dim=-1)
            self.last_logprobs[:bs].zero_()
            return tokens
        probs = torch.softmax(logits[:bs].float() / temps[:, None], dim=-1)
        tokens = torch.argmax(probs, dim=-1)
        self.last_logprobs[:bs].copy_(torch.log(probs.gather(1, tokens[:, None]).squeeze(1)))
        return tokens

    def finalize(self, next_tokens: torch.Tensor) -> SamplerOutput:
        bs = next_tokens.shape[0]
        hit = torch.isin(next_tokens, self.stop_ids)
        finished_rows = self.row_ids[:bs][hit]  # expect: FC101
        next_tokens = torch.where(hit, torch.full_like(next_tokens, self.eos), next_tokens)  # ok: FC101
        self.tokens_host[:bs].copy_(next_tokens, non_blocking=True)  # ok: FC101
        ready = torch.cuda.Event()
        ready.record()
        logprobs = None
        if self.return_logprobs:
            logprobs = self.last_logprobs[:bs].tolist()  # expect: FC101
        return SamplerOutput(tokens_host=self.tokens_host[:bs], ready=ready, finished_rows=finished_rows,
                             logprobs=logprobs)
