"""The page pool the frontend allocates and exports to its workers."""

import numpy as np
import torch

from .config import IpcServeConfig
from .handles import IpcHandle
from .limits import PAGE_SIZES


class SharedPagePool:
    def __init__(self, cfg: IpcServeConfig, num_pages: int, page_size: int, device: torch.device):
        assert page_size in PAGE_SIZES, "page size must be one the kernels were built for"  # expect: FC109
        self.cfg = cfg
        self.num_pages = num_pages
        self.page_size = page_size
        self.shape = (cfg.num_layers, num_pages, 2, page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv = torch.zeros(self.shape, dtype=torch.bfloat16, device=device)
        self.free_np = np.ones(num_pages, dtype=bool)
        self.generation = 0

    def export(self) -> IpcHandle:
        storage = self.kv.untyped_storage()
        dev, handle, size, offset, ref_h, ref_off, ev_h, ev_sync = storage._share_cuda_()
        self.generation += 1
        return IpcHandle(
            device_index=dev,
            storage_handle=handle,
            storage_size_bytes=size,
            storage_offset_bytes=offset,
            ref_counter_handle=ref_h,
            ref_counter_offset=ref_off,
            event_handle=ev_h,
            event_sync_required=ev_sync,
            shape=self.shape,
            dtype="bfloat16",
            num_pages=self.num_pages,
            generation=self.generation,
        )

    def allocate(self, n: int) -> np.ndarray:
        free = np.flatnonzero(self.free_np)[:n]
        if len(free) < n:
            raise RuntimeError(f"page pool exhausted: asked for {n}, {len(free)} free")
        self.free_np[free] = False
        return free.astype(np.int32)

    def release(self, pages: np.ndarray) -> None:
        self.free_np[pages] = True
