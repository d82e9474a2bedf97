"""Per-page min/max key summaries (the Quest criticality bound)."""

import torch

from quest.config import QuestConfig


class PageSummaryCache:
    def __init__(self, cfg: QuestConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.max_pages = cfg.num_pages
        shape = (cfg.num_layers, cfg.num_pages, cfg.num_kv_heads, cfg.head_dim)
        self.key_min = torch.full(shape, float("inf"), dtype=torch.bfloat16, device=device)
        self.key_max = torch.full(shape, float("-inf"), dtype=torch.bfloat16, device=device)
        self.dirty = torch.zeros(cfg.num_pages, dtype=torch.bool, device=device)
        self.num_summarized = 0

    def mark_dirty(self, last_pages: torch.Tensor) -> None:
        self.dirty[last_pages.long()] = True

    def update_summaries(self, k_caches, row_last_pages: torch.Tensor) -> None:
        self.mark_dirty(row_last_pages)
        dirty = torch.nonzero(self.dirty).squeeze(1)  # expect: FC101
        for layer, k_cache in enumerate(k_caches):
            keys = k_cache[dirty]  # [n, page_size, kv_heads, d]
            self.key_min[layer, dirty] = keys.amin(dim=1)
            self.key_max[layer, dirty] = keys.amax(dim=1)
        self.num_summarized += dirty.numel()
        self.dirty.zero_()

    def upper_bound_scores(self, layer: int, q: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
        # q: [bs, kv_heads, group, d]; pages: [bs, P] page ids (0 = padding)
        kmin = self.key_min[layer, pages.long()]  # [bs, P, kv_heads, d]
        kmax = self.key_max[layer, pages.long()]
        qg = q.sum(dim=2).unsqueeze(1)  # [bs, 1, kv_heads, d]
        bound = torch.maximum(qg * kmin, qg * kmax).sum(dim=-1)  # [bs, P, kv_heads]
        return bound.float().amax(dim=-1)

    def reset_pages(self, pages: torch.Tensor) -> None:
        self.key_min[:, pages.long()] = float("inf")
        self.key_max[:, pages.long()] = float("-inf")
        self.num_summarized -= pages.numel()
        self._check_counts()

    def _check_counts(self) -> None:
        assert 0 <= self.num_summarized <= self.max_pages  # ok: FC109
