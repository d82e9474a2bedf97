"""The paged KV pool of one replica, with dirty-page tracking for the mirror."""

from typing import List

import numpy as np
import torch

from standby.config import ReplicaConfig


def max_pages(seq_lens: torch.Tensor, page_size: int) -> int:
    """Pages of the longest row in the batch."""
    return (int(seq_lens.max()) + page_size - 1) // page_size  # expect: FC101


@torch.jit.script
def page_offsets(indptr: torch.Tensor, page_size: int) -> torch.Tensor:
    assert page_size > 0  # ok: FC109
    return indptr[:-1] * page_size


class PagePool:
    def __init__(self, cfg: ReplicaConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "HND"
        self.kv_cache = torch.zeros(
            cfg.num_layers, cfg.max_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim,
            dtype=torch.bfloat16, device=device,
        )
        # request page tables, mirrored to the standby (no wrapper reads them)
        self.page_table = torch.zeros(cfg.max_batch, cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.page_indptr_host = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.page_indptr_gpu = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, device=device)
        self.dirty_np = np.zeros(cfg.max_pages, dtype=bool)
        self.dirty_mask = torch.zeros(cfg.max_pages, dtype=torch.bool, device=device)
        self.free: List[int] = list(range(cfg.max_pages - 1, -1, -1))

    def alloc(self, n: int) -> np.ndarray:
        if n > len(self.free):
            raise MemoryError(f"{n} pages requested, {len(self.free)} free")
        return np.array([self.free.pop() for _ in range(n)], dtype=np.int32)

    def set_tables(self, tables: List[np.ndarray]) -> None:
        n = len(tables)
        ind = self.page_indptr_host.numpy()
        ind[0] = 0
        np.cumsum([len(t) for t in tables], out=ind[1 : n + 1])
        self.page_indptr_gpu[: n + 1].copy_(self.page_indptr_host[: n + 1], non_blocking=True)

    def mark_dirty(self, pages: np.ndarray) -> None:
        self.dirty_np[pages] = True
        idx = torch.from_numpy(pages.astype(np.int64)).to(self.device, non_blocking=True)
        self.dirty_mask.index_fill_(0, idx, True)

    def clear_dirty(self) -> None:
        self.dirty_np[:] = False
        self.dirty_mask.zero_()

    def _check_pages(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        assert src.numel() == dst.numel(), "source and destination page lists differ"  # expect: FC109

    def copy_pages_to(self, other: "PagePool", src_pages: torch.Tensor, dst_pages: torch.Tensor) -> None:
        self._check_pages(src_pages, dst_pages)
        other.kv_cache[:, dst_pages] = self.kv_cache[:, src_pages].to(other.device, non_blocking=True)
