"""Speculative prefix matching: accept the longest draft prefix the target agrees with."""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import torch

from tokheal.healer import HealPlan
from tokheal.trie import PrefixTrie


class SpeculativePrefixMatcher:
    def __init__(self, k: int, max_batch: int, device: torch.device) -> None:
        self.k = k
        self.max_batch = max_batch
        self.device = device

    def propose(self, plans: List[HealPlan], trie: PrefixTrie) -> np.ndarray:
        """Host drafts: for every healing row the k shortest tokens that cover the removed text."""
        drafts = np.zeros((len(plans), self.k), dtype=np.int64)
        for i, plan in enumerate(plans):
            cand = trie.allowed_ids(plan.remaining)[: self.k]
            drafts[i, : len(cand)] = cand
        return drafts

    def match(self, draft: torch.Tensor, target: torch.Tensor, fallback: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        agree = (draft == target[:, : draft.shape[1]]).int().cumprod(dim=1)
        accepted_len = agree.sum(dim=1)
        first = torch.where(accepted_len > 0, draft[:, 0], fallback)  # ok: FC101
        if getattr(self, "_scratch", None) is None:
            self._scratch = torch.empty((self.max_batch, self.k + 1), dtype=torch.int64, device=self.device)  # ok: FC107
        n = draft.shape[0]
        self._scratch[:n, 0] = first
        self._scratch[:n, 1:] = draft * agree
        return accepted_len, self._scratch[:n]
