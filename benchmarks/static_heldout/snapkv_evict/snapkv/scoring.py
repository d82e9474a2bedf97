"""Observation-window scores accumulated per page, and victim selection."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from snapkv.config import SnapConfig


@dataclass
class EvictionState:
    evict_counts: torch.Tensor
    victims: torch.Tensor
    victims_pinned: torch.Tensor

    @property
    def num_evictable(self) -> int:
        return int(self.evict_counts.sum())  # expect: FC101


class ObservationWindowScorer:
    """Keeps a decayed per-page attention mass for every running row."""

    def __init__(self, cfg: SnapConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.window = cfg.window
        self.page_size = cfg.page_size
        self.budget_pages = cfg.budget_pages
        self.decay = cfg.score_decay
        self.pool = cfg.pool_kernel
        self.score_accum = torch.zeros(
            cfg.max_batch_size, cfg.max_pages_per_req, dtype=torch.float32, device=device
        )
        self.state = EvictionState(
            evict_counts=torch.zeros(cfg.max_batch_size, dtype=torch.int32, device=device),
            victims=torch.full((cfg.max_batch_size, cfg.max_victims), -1, dtype=torch.int32, device=device),
            victims_pinned=torch.full((cfg.max_batch_size, cfg.max_victims), -1, dtype=torch.int32, pin_memory=True),
        )
        self.victim_scratch = None

    def set_budget(self, budget_pages: int) -> None:
        assert budget_pages * self.page_size >= self.window  # expect: FC109
        self.budget_pages = budget_pages

    def reset_rows(self, rows: torch.Tensor) -> None:
        self.score_accum.index_fill_(0, rows, 0.0)

    def accumulate(self, window_mass: torch.Tensor, page_counts: torch.Tensor, bs: int) -> None:
        # window_mass: [bs, pages] softmax mass of the observation window per page
        pooled = F.max_pool1d(
            window_mass.unsqueeze(1), kernel_size=self.pool, stride=1, padding=self.pool // 2
        ).squeeze(1)
        if pooled.shape[1] > self.score_accum.shape[1]:
            extra = pooled.shape[1] - self.score_accum.shape[1]
            self.score_accum = torch.cat([self.score_accum, self.score_accum.new_zeros(self.score_accum.shape[0], extra)], dim=1)  # expect: FC107
        cols = pooled.shape[1]
        self.score_accum[:bs, :cols].mul_(self.decay).add_(pooled)
        over = page_counts[:bs] > self.budget_pages
        if over.any():  # expect: FC101
            self._protect_window(bs, page_counts)

    def _protect_window(self, bs: int, page_counts: torch.Tensor) -> None:
        # pages that hold the observation window are never evicted
        win_pages = (self.window + self.page_size - 1) // self.page_size
        cols = torch.arange(self.score_accum.shape[1], device=self.device)
        last = page_counts[:bs].unsqueeze(1).long()
        in_window = (cols.unsqueeze(0) >= last - win_pages) & (cols.unsqueeze(0) < last)
        self.score_accum[:bs] = torch.where(in_window, torch.finfo(torch.float32).max, self.score_accum[:bs])

    def select_victims(self, bs: int, page_counts: torch.Tensor) -> EvictionState:
        need = (page_counts[:bs] - self.budget_pages).clamp_(min=0, max=self.cfg.max_victims)
        self.state.evict_counts[:bs].copy_(need)
        if self.victim_scratch is None:
            self.victim_scratch = torch.empty_like(self.score_accum)  # ok: FC107
        scores = self.victim_scratch[:bs]
        scores.copy_(self.score_accum[:bs])
        order = torch.argsort(scores, dim=1)
        k = self.state.victims.shape[1]
        ranks = torch.arange(k, device=self.device).unsqueeze(0)
        picked = torch.where(ranks < need.unsqueeze(1), order[:, :k].to(torch.int32), -1)
        self.state.victims[:bs].copy_(picked)
        self.state.victims_pinned[:bs].copy_(self.state.victims[:bs], non_blocking=True)  # ok: FC101
        return self.state
