"""Top-k page selection per step from the summary bound."""

from typing import Optional

import torch

from quest.summaries import PageSummaryCache


class TopKPageSelector:
    def __init__(self, token_budget: int, page_size: int, max_batch_size: int, device: torch.device):
        assert token_budget % page_size == 0  # expect: FC109
        self.k_pages = token_budget // page_size
        self.page_size = page_size
        self.max_batch_size = max_batch_size
        self.device = device
        self.topk_buf: Optional[torch.Tensor] = None

    def select(self, summaries: PageSummaryCache, layer: int, q_proxy: torch.Tensor, req_pages: torch.Tensor,
               page_counts_gpu: torch.Tensor, bs: int) -> torch.Tensor:
        k = min(self.k_pages, int(page_counts_gpu[:bs].max()))  # expect: FC101
        if self.topk_buf is None or self.topk_buf.shape[0] < bs or self.topk_buf.shape[1] < k:
            self.topk_buf = torch.empty(self.max_batch_size, self.k_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        pages = req_pages[:bs]
        scores = summaries.upper_bound_scores(layer, q_proxy[:bs], pages)
        cols = torch.arange(pages.shape[1], device=self.device).unsqueeze(0)
        valid = cols < page_counts_gpu[:bs].unsqueeze(1)
        scores = torch.where(valid, scores, torch.full_like(scores, float("-inf")))  # ok: FC101
        # the page being written is always attended
        last = (page_counts_gpu[:bs] - 1).clamp(min=0).long().unsqueeze(1)
        scores.scatter_(1, last, float("inf"))
        top = torch.topk(scores, k, dim=1, sorted=True).indices
        out = self.topk_buf[:bs, :k]
        out.copy_(torch.gather(pages, 1, top).to(torch.int32))
        return out
