"""Greedy tree verification: the longest draft path the target model agrees with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
import torch

from spec_tree.tree import TreeSpec


@dataclass
class VerifyOutput:
    accepted_tokens: torch.Tensor
    accept_lens: torch.Tensor
    accept_lens_cpu: List[int]
    best_leaf: torch.Tensor
    hit_eos: torch.Tensor
    all_rejected_rows: np.ndarray


class TreeVerifier:
    def __init__(self, tree: TreeSpec, eos_token_id: int, device: torch.device):
        self.tree = tree
        self.eos_token_id = eos_token_id
        self.retrieve_indices = torch.as_tensor(tree.retrieve_indices, device=device).clamp_min(0)
        self.depth_range = torch.arange(tree.depth, device=device)

    def verify(self, logits: torch.Tensor, draft_tokens: torch.Tensor, bs: int) -> VerifyOutput:
        target = logits.argmax(-1).view(bs, -1)
        cand = draft_tokens[:, self.retrieve_indices]
        tgt = target[:, self.retrieve_indices]
        match = (cand[..., 1:] == tgt[..., :-1]).int().cumprod(-1)
        accept_lens, best_leaf = match.sum(-1).max(-1)
        rows = torch.arange(bs, device=logits.device)
        best_path = tgt[rows, best_leaf]
        accepted_mask = self.depth_range[None, :] <= accept_lens[:, None]
        accepted_tokens = torch.masked_select(best_path, accepted_mask)  # expect: FC101
        hit_eos = ((best_path == self.eos_token_id) & accepted_mask).any(-1)
        accept_lens_cpu = accept_lens.tolist()  # expect: FC101
        all_rejected_rows = np.flatnonzero(np.asarray(accept_lens_cpu) == 0)  # ok: FC101
        return VerifyOutput(accepted_tokens, accept_lens, accept_lens_cpu, best_leaf, hit_eos, all_rejected_rows)
