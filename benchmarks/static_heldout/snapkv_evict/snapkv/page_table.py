"""Per-request page lists with a pinned host mirror of the counts."""

from typing import List, Tuple

import torch


class PageTable:
    def __init__(self, max_reqs: int, max_pages_per_req: int, num_pages: int, page_size: int, device: torch.device):
        assert page_size in (1, 8, 16, 32, 64)  # expect: FC109
        self.max_reqs = max_reqs
        self.max_pages_per_req = max_pages_per_req
        self.num_pages = num_pages
        self.page_size = page_size
        self.device = device
        self.req_to_page = torch.zeros(max_reqs, max_pages_per_req, dtype=torch.int32, device=device)
        self.page_counts = torch.zeros(max_reqs, dtype=torch.int32, device=device)
        self.page_counts_cpu = torch.zeros(max_reqs, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_reqs, dtype=torch.int32, pin_memory=True)
        self.free_pages: List[int] = list(range(1, num_pages))
        self.free_rows: List[int] = list(range(max_reqs))
        self._pages_in_use = 0
        self._rows_used = 0

    def reserve_row(self) -> int:
        row = self.free_rows.pop()
        self._rows_used += 1
        assert self._rows_used <= self.max_reqs  # ok: FC109
        return row

    def append_page(self, row: int) -> int:
        page = self.free_pages.pop()
        n = int(self.page_counts_cpu[row])
        self.req_to_page[row, n] = page
        self.page_counts_cpu[row] = n + 1
        self.page_counts[row] = n + 1
        self._pages_in_use += 1
        return page

    def compact_row(self, row: int, row_scores: torch.Tensor, budget: int) -> Tuple[torch.Tensor, int]:
        n = int(self.page_counts_cpu[row])
        if n <= budget:
            return self.req_to_page[row, :n], n
        pages = self.req_to_page[row, :n]
        cutoff = torch.kthvalue(row_scores[:n], n - budget).values
        kept = pages[row_scores[:n] > cutoff]  # expect: FC101
        new_n = kept.numel()
        self.req_to_page[row, :new_n] = kept
        self.page_counts[row] = new_n
        self.page_counts_cpu[row] = new_n
        return kept, new_n

    def release(self, pages: List[int]) -> None:
        self.free_pages.extend(p for p in pages if p > 0)
        self._pages_in_use -= len(pages)
        self._check_invariants()

    def _check_invariants(self) -> None:
        assert len(self.free_pages) + self._pages_in_use == self.num_pages - 1  # ok: FC109
