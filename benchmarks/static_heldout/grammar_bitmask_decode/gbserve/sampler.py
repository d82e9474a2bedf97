"""Masked sampling: host-filled token bitmasks applied to the logits on the device, plus jump-forward."""

from __future__ import annotations

from typing import Dict, List

import flashinfer
import torch
import xgrammar as xgr

from gbserve.config import GBConfig
from gbserve.grammar.matcher_pool import GrammarMatcherPool, JumpForward


class BitmaskSampler:
    def __init__(self, cfg: GBConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        words = cfg.bitmask_words
        self.bitmask_cpu = torch.full((cfg.max_batch_size, words), -1, dtype=torch.int32, pin_memory=True)
        self.bitmask_gpu = torch.full((cfg.max_batch_size, words), -1, dtype=torch.int32, device=device)
        self.temperature_cpu = torch.ones(cfg.max_batch_size, dtype=torch.float32, pin_memory=True)
        self.temperature_gpu = torch.ones(cfg.max_batch_size, dtype=torch.float32, device=device)
        self.next_ids_gpu = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=device)
        self._backend = "xgrammar"

    def sample(self, logits: torch.Tensor, rids: List[int], constrained: bool, masked_in_graph: bool) -> torch.Tensor:
        bs = len(rids)
        if constrained and not masked_in_graph:
            if not self.bitmask_cpu[:bs].eq(-1).all():  # ok: FC101
                self.bitmask_gpu[:bs].copy_(self.bitmask_cpu[:bs], non_blocking=True)
                if (self.bitmask_gpu[:bs] == 0).all(dim=-1).any():  # expect: FC101
                    raise RuntimeError("a grammar admits no token at this position")
                xgr.apply_token_bitmask_inplace(logits, self.bitmask_gpu[:bs])
        next_ids = self.next_ids_gpu[:bs]
        if all(float(self.temperature_cpu[i]) == 0.0 for i in range(bs)):  # ok: FC101
            next_ids.copy_(logits.argmax(dim=-1))
        else:
            self.temperature_gpu[:bs].copy_(self.temperature_cpu[:bs], non_blocking=True)
            probs = torch.softmax(logits / self.temperature_gpu[:bs, None].clamp_min(1e-5), dim=-1)
            next_ids.copy_(flashinfer.sampling.sampling_from_probs(probs))
        return next_ids

    def jump_forward(
        self, next_ids: torch.Tensor, rids: List[int], pool: GrammarMatcherPool, jf: JumpForward
    ) -> Dict[int, List[int]]:
        """Feeds the sampled token to each structured request's matcher and collects the forced continuation."""
        jumps: Dict[int, List[int]] = {}
        for i, rid in enumerate(rids):
            if not pool.is_structured(rid):
                continue
            tok = int(next_ids[i])  # expect: FC101
            pool.accept(rid, tok)
            forced = jf.forced_tokens(rid)
            if forced:
                jumps[rid] = forced
        return jumps
