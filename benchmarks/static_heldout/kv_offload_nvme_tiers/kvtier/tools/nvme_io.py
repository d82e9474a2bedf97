"""NVMe page store and the GPU <-> pinned-host page movers.

Lives under ``tools/`` for historical reasons (it started as the offline dump tool).
"""

import os
from typing import Optional

import numpy as np
import torch
import triton
import triton.language as tl


class NvmeStore:
    """Fixed-size page records in one preallocated file, read through a memmap."""

    def __init__(self, path: str, num_pages: int, page_bytes: int):
        self.path = path
        self.page_bytes = page_bytes
        self.num_pages = num_pages
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.truncate(num_pages * page_bytes)
        self._mm = np.memmap(path, dtype=np.uint8, mode="r+", shape=(num_pages, page_bytes))
        self._kv_layout = "HND"
        self._open = True

    def read_pages(self, page_ids: np.ndarray, out_host: torch.Tensor) -> None:
        assert self._open, "store closed"  # ok: FC109
        rows = self._mm[page_ids]
        out_host[: len(page_ids)].copy_(torch.from_numpy(np.ascontiguousarray(rows)).view(out_host.dtype))

    def write_pages(self, page_ids: np.ndarray, data_host: torch.Tensor) -> None:
        assert data_host.shape[0] == len(page_ids), "one record per page"  # expect: FC109
        self._mm[page_ids] = data_host.view(torch.uint8).reshape(len(page_ids), -1).numpy()

    def flush(self) -> None:
        self._mm.flush()

    def close(self) -> None:
        self._mm.flush()
        self._open = False


def evict_to_host(kv_cache: torch.Tensor, src_slots: torch.Tensor, host_pool: torch.Tensor, start: int) -> None:
    """Copy GPU pages ``src_slots`` into the pinned host pool at ``start`` (synchronous)."""
    n = src_slots.shape[0]
    dev_pages = kv_cache[:, src_slots].transpose(0, 1).contiguous()
    host_view = host_pool[start : start + n]
    host_view.copy_(dev_pages)  # expect: FC101


def evict_async(kv_cache: torch.Tensor, src_slots: torch.Tensor, host_pool: torch.Tensor, start: int, stream) -> None:
    n = src_slots.shape[0]
    with torch.cuda.stream(stream):
        dev_pages = kv_cache[:, src_slots].transpose(0, 1).contiguous()
        host_pool[start : start + n].copy_(dev_pages, non_blocking=True)  # ok: FC101


@triton.jit
def _scatter_pages_kernel(src_ptr, dst_ptr, slot_ptr, page_elems, BLOCK: tl.constexpr):
    assert BLOCK >= 128  # ok: FC109
    pid = tl.program_id(0)
    blk = tl.program_id(1)
    slot = tl.load(slot_ptr + pid)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < page_elems
    vals = tl.load(src_ptr + pid * page_elems + offs, mask=mask)
    tl.store(dst_ptr + slot * page_elems + offs, vals, mask=mask)


def scatter_pages(src: torch.Tensor, dst: torch.Tensor, slots: torch.Tensor, block: Optional[int] = None) -> None:
    """Land staged pages ``src[i]`` into ``dst[slots[i]]`` for every layer slab."""
    n = slots.shape[0]
    page_elems = src[0].numel()
    blk = block or 1024
    grid = (n, triton.cdiv(page_elems, blk))
    _scatter_pages_kernel[grid](src, dst, slots, page_elems, BLOCK=blk)
