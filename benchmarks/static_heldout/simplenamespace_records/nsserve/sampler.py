"""Sampling over loose per-request parameters.

The model runner hands the sampler a plain dict of per-request tensors (temperatures, top-k, top-p,
min-tokens); the sampler copies it onto a ``SimpleNamespace`` and reads options through a
``ChainMap`` whose last layer holds the engine's defaults, so a step may leave any of them out.
"""

from __future__ import annotations

from collections import ChainMap
from types import SimpleNamespace
from typing import Any, Mapping

import torch


class Sampler:
    def __init__(self, cfg: SimpleNamespace):
        self.eos_id = cfg.eos_token_id
        self.max_top_k = cfg.max_top_k
        self.defaults: dict[str, Any] = {
            "greedy_eps": 1e-5,
            "return_logprobs": False,
        }

    def sampling_record(self, fields: Mapping[str, Any]) -> SimpleNamespace:
        sinfo = SimpleNamespace()
        for key, value in fields.items():
            setattr(sinfo, key, value)
        return sinfo

    def sample(self, logits: torch.Tensor, step: SimpleNamespace, fields: Mapping[str, Any]) -> torch.Tensor:
        sinfo = self.sampling_record(fields)
        opts = ChainMap(vars(sinfo), self.defaults)
        temps = opts["temperatures"]
        logits = logits[: step.batch_size].float()
        logits.div_(temps.clamp(min=opts["greedy_eps"]).unsqueeze(1))
        if (opts["top_k"] > 0).any():  # expect: FC101
            logits = self._apply_top_k(logits, opts["top_k"])
        if opts["top_p_cpu"].lt(1.0).any():  # ok: FC101
            logits = self._apply_top_p(logits, opts["top_p"])
        too_short = opts["min_tokens_left"] > 0
        logits[too_short, self.eos_id] = float("-inf")  # ok: FC101
        probs = torch.softmax(logits, dim=-1)
        sampled = torch.multinomial(probs, 1).squeeze(1)
        greedy = logits.argmax(dim=-1)
        next_tokens = torch.where(temps <= opts["greedy_eps"], greedy, sampled)  # ok: FC101
        if opts["return_logprobs"]:
            step.logprobs = torch.log_softmax(logits, dim=-1).gather(1, next_tokens.unsqueeze(1)).squeeze(1)
        return next_tokens

    def _apply_top_k(self, logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
        vals, _ = logits.topk(self.max_top_k, dim=-1)
        kth = vals.gather(1, (top_k.clamp(1, self.max_top_k) - 1).long().unsqueeze(1))
        kth = torch.where(top_k.unsqueeze(1) > 0, kth, torch.full_like(kth, float("-inf")))
        return logits.masked_fill(logits < kth, float("-inf"))

    def _apply_top_p(self, logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = (cum - sorted_logits.softmax(dim=-1)) > top_p.unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        return torch.empty_like(logits).scatter_(1, order, sorted_logits)
