"""Checksums of KV pages, computed on the device and recorded on the host."""
from __future__ import annotations

import numpy as np
import torch


@torch.jit.script
def fold_pages(words: torch.Tensor, page_words: int) -> torch.Tensor:
    assert page_words > 0  # ok: FC109
    w = words.view(-1, page_words).to(torch.int64)
    weights = torch.arange(1, page_words + 1, device=words.device, dtype=torch.int64)
    return (w * weights).sum(dim=1) % 2147483647


def page_checksums(kv_cache: torch.Tensor, page_ids: torch.Tensor) -> torch.Tensor:
    """One checksum per page over all layers; kv_cache is [layers, pages, 2, page, heads, dim]."""
    pages = kv_cache.index_select(1, page_ids).transpose(0, 1).contiguous()
    words = pages.view(page_ids.shape[0], -1).view(torch.int16)
    return fold_pages(words.flatten(), words.shape[1])


class ChecksumRecords:
    """What each page's checksum was when its KV was last written."""

    def __init__(self, num_pages: int) -> None:
        self.expected = np.zeros(num_pages, dtype=np.int64)
        self.valid = np.zeros(num_pages, dtype=bool)

    def record(self, page_ids_np: np.ndarray, sums_np: np.ndarray) -> None:
        self.expected[page_ids_np] = sums_np
        self.valid[page_ids_np] = True

    def expected_tensor(self, page_ids_np: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.expected[page_ids_np])

    def invalidate(self, page_ids_np: np.ndarray) -> None:
        self.valid[page_ids_np] = False
