"""Per-page attention mass, accumulated every decode step (H2O's heavy-hitter statistic)."""

from __future__ import annotations

import torch


class HeavyHitterTracker:
    def __init__(self, max_batch: int, max_pages: int, decay: float, device: torch.device):
        self.max_batch = max_batch
        self.decay = decay
        self.scores = torch.zeros((max_batch, max_pages), dtype=torch.float32, device=device)
        self.protected = torch.zeros((max_batch, max_pages), dtype=torch.bool, device=device)
        self.step_scores_host = torch.zeros((max_batch, max_pages), dtype=torch.float32, pin_memory=True)

    def accumulate(self, bs: int, page_scores: torch.Tensor, num_pages: int) -> None:
        if num_pages > self.scores.shape[1]:
            self.scores.resize_(self.max_batch, num_pages)  # expect: FC107
        if num_pages > self.step_scores_host.shape[1]:
            self.step_scores_host = torch.zeros((self.max_batch, num_pages), dtype=torch.float32, pin_memory=True)  # ok: FC107
        self.scores[:bs, :num_pages].mul_(self.decay).add_(page_scores[:, :num_pages])
        if torch.isnan(self.scores[:bs, :num_pages]).any():  # expect: FC101
            self.scores[:bs].nan_to_num_(nan=0.0)

    def select_victims(self, bs: int, n_evict: int, num_pages: int, recent: int) -> torch.Tensor:
        scores = self.scores[:bs, :num_pages].clone()
        scores[:, max(0, num_pages - recent) :] = float("inf")   # never evict the recent window
        scores = torch.where(self.protected[:bs, :num_pages], float("inf"), scores)  # ok: FC101
        return torch.topk(scores, n_evict, dim=1, largest=False).indices

    def forget(self, bs: int, victims: torch.Tensor) -> None:
        self.scores[:bs].scatter_(1, victims, 0.0)
