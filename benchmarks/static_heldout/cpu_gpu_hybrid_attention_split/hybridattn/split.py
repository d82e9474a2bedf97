"""Which tokens of each request are attended on the host and which on the GPU."""

from dataclasses import dataclass
from typing import List

import numpy as np
import torch


@dataclass
class SplitPlan:
    far_lens_np: np.ndarray          # tokens per row attended on the host
    near_pages_np: np.ndarray        # window pages per row on the GPU
    far_pages: List[np.ndarray]      # host page ids per row


class SplitPlanner:
    """Pages older than the window live in host memory; the window's pages live on the GPU."""

    def __init__(self, window: int, page_size: int):
        assert window % page_size == 0, "the GPU window must cover whole pages"  # expect: FC109
        self.window_pages = window // page_size
        self.page_size = page_size

    def split(self, seq_lens_np: np.ndarray, host_tables: List[np.ndarray]) -> SplitPlan:
        pages_np = (seq_lens_np + self.page_size - 1) // self.page_size
        far_pages_np = np.maximum(pages_np - self.window_pages, 0)
        return SplitPlan(
            far_lens_np=far_pages_np * self.page_size,
            near_pages_np=pages_np - far_pages_np,
            far_pages=[tbl[:n] for tbl, n in zip(host_tables, far_pages_np)],
        )


def cpu_token_counts(seq_lens: torch.Tensor, window_pages: int, page_size: int) -> List[int]:
    """Tokens of each row that the host attends (whole pages older than the window)."""
    far_pages = torch.clamp((seq_lens + page_size - 1) // page_size - window_pages, min=0)
    return (far_pages * page_size).tolist()  # expect: FC101


def window_last_page_len(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    return (seq_lens - 1) % page_size + 1
