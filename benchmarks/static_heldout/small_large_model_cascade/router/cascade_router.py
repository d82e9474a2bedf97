"""The per-step router: decode the small tier, score difficulty, escalate, decode the large tier."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from cascade.requests import Request, Tier
from cascade.scoring import DifficultyScorer
from router.migrate import PrefixMigrator
from tiers.batch import TierBatch
from tiers.runtime import TierRuntime


class CascadeRouter:
    def __init__(self, small: TierRuntime, large: TierRuntime, scorer: DifficultyScorer,
                 migrator: PrefixMigrator, token_hist: torch.Tensor, device: torch.device):
        self.small = small
        self.large = large
        self.large_graphs = large.graphs
        self.scorer = scorer
        self.migrator = migrator
        self.token_hist = token_hist
        self.device = device

    def _record_tokens(self, batch: TierBatch, next_ids: torch.Tensor) -> None:
        self.token_hist[batch.slots, batch.positions + 1] = next_ids

    def _grow_large_inputs(self, n: int) -> None:
        if n > self.large_graphs.input_ids.shape[0]:
            self.large_graphs.input_ids = self.large_graphs.input_ids.new_zeros(n)  # expect: FC107

    def step(self, reqs: List[Request]) -> Dict[str, Tuple[List[Request], torch.Tensor]]:
        small_reqs = [r for r in reqs if r.tier is Tier.SMALL]
        large_reqs = [r for r in reqs if r.tier is Tier.LARGE]
        out: Dict[str, Tuple[List[Request], torch.Tensor]] = {}
        if small_reqs:
            sb = TierBatch.build(small_reqs, self.small.pool, self.device)
            sb.escalated = torch.zeros(sb.batch_size, dtype=torch.bool, device=self.device)  # ok: FC107
            logits = self.small.run_decode(sb)
            hard = self.scorer.score(small_reqs, logits)
            keep = [r for r in small_reqs if r not in hard]
            next_ids = torch.argmax(logits, dim=-1)
            self._record_tokens(sb, next_ids)
            out["small"] = (small_reqs, next_ids)
            if hard:
                self._grow_large_inputs(len(large_reqs) + len(hard))
                self.migrator.migrate(hard)
                large_reqs = large_reqs + hard
            small_reqs = keep
        if large_reqs:
            lb = TierBatch.build(large_reqs, self.large.pool, self.device)
            logits = self.large.run_decode(lb)
            next_ids = torch.argmax(logits, dim=-1)
            self._record_tokens(lb, next_ids)
            out["large"] = (large_reqs, next_ids)
        return out
