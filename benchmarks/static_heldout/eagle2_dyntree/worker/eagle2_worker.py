"""EAGLE-2 worker: draft a dynamic tree, verify it in one pass of the target, accept along the tree."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from eagle2 import Eagle2Config, Eagle2Drafter, TreeVerifyBackend, VerifyGraphRunner
from eagle2.batch import SpecForwardBatch


class Eagle2Worker:
    def __init__(self, cfg: Eagle2Config, drafter: Eagle2Drafter, backend: TreeVerifyBackend,
                 graphs: VerifyGraphRunner, device: torch.device) -> None:
        self.cfg, self.drafter, self.backend, self.graphs, self.device = cfg, drafter, backend, graphs, device
        self._accept_len: Optional[torch.Tensor] = None

    def _bucket(self, bs: int, ts: int) -> Optional[Tuple[int, int]]:
        if ts not in self.cfg.tree_sizes:
            return None
        return next(((b, ts) for b in self.cfg.verify_bs if b >= bs), None)

    def step(self, fb: SpecForwardBatch, hidden: torch.Tensor, root_tokens: torch.Tensor):
        tree = self.drafter.draft(fb, hidden)
        bs, ts = tree.tokens.shape
        n = bs * ts
        self.graphs.input_ids[:n].copy_(tree.tokens.flatten())
        self.graphs.tree_positions = (fb.seq_lens[:, None] + tree.depth - 1).flatten().clone()  # expect: FC107
        key = self._bucket(bs, ts)
        if key is None:
            logits, _ = self.graphs.run_eager(self.backend.verify_eager(fb, tree), n)
        else:
            self.backend.prepare_verify(key[0], key[1], fb, tree)
            logits = self.graphs.replay(key)[:n]
        pred = logits.argmax(-1).view(bs, ts)
        expected = torch.where(tree.parents >= 0, pred.gather(1, tree.parents.clamp(min=0)), root_tokens[:, None])  # ok: FC101
        ok = tree.tokens == expected
        accept = ~(tree.mask & ~ok[:, None, :]).any(-1)  # a node stands if all its ancestors matched
        if self._accept_len is None:
            self._accept_len = torch.zeros(self.cfg.max_bs, dtype=torch.int64, device=self.device)  # ok: FC107
        torch.amax(accept * tree.depth, dim=-1, out=self._accept_len[:bs])
        accepted_tokens = tree.tokens[accept]  # expect: FC101
        return accepted_tokens, self._accept_len[:bs]

    def acceptance_rate(self) -> float:
        return self._accept_len.float().mean().item() / self.cfg.depth  # ok: FC101
