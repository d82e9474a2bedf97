"""IPC handles of the shared page pool and the per-page generation registry."""

from dataclasses import dataclass
from typing import Dict, Tuple

import numpy as np
import torch


@dataclass(frozen=True)
class IpcHandle:
    device_index: int
    storage_handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    shape: Tuple[int, ...]
    dtype: str
    num_pages: int
    generation: int

    def share_args(self) -> tuple:
        return (
            self.device_index,
            self.storage_handle,
            self.storage_size_bytes,
            self.storage_offset_bytes,
            self.ref_counter_handle,
            self.ref_counter_offset,
            self.event_handle,
            self.event_sync_required,
        )


class IpcPageRegistry:
    """Which pool generation each page was last written under; stale pages lose their prefix-cache entries."""

    def __init__(self, num_pages: int, device: torch.device):
        self.handles: Dict[int, IpcHandle] = {}
        self.page_epoch_np = np.zeros(num_pages, dtype=np.int64)
        self.page_epoch_dev = torch.zeros(num_pages, dtype=torch.int64, device=device)
        self.generation = 0
        self.num_stale = 0

    def register(self, handle: IpcHandle) -> None:
        self.handles[handle.generation] = handle
        self.generation = max(self.generation, handle.generation)

    def refresh(self, epochs_np: np.ndarray) -> np.ndarray:
        changed = np.flatnonzero(self.page_epoch_np != epochs_np)  # ok: FC101
        self.page_epoch_np[changed] = epochs_np[changed]
        self.page_epoch_dev.copy_(torch.from_numpy(epochs_np), non_blocking=True)
        stale = torch.nonzero(self.page_epoch_dev < self.generation)  # expect: FC101
        self.num_stale = stale.shape[0]
        return changed
