"""Old -> new page ids for the pages a compaction pass has moved but not yet published."""

import numpy as np
import torch


class RemapTable:
    def __init__(self, num_pages: int, device: torch.device):
        self.device = device
        self.capacity = num_pages
        self.map_np = np.arange(num_pages, dtype=np.int32)
        self.map_gpu = torch.arange(num_pages, dtype=torch.int32, device=self.device)
        # 1 where a page's copy is queued on the copy stream and not yet published
        self.pending_gpu = torch.zeros(num_pages, dtype=torch.int32, device=self.device)
        self._pending = []

    def record_move(self, src: int, dst: int) -> None:
        assert src != dst, "a page cannot move onto itself"  # expect: FC109
        self.map_np[src] = dst
        self._pending.append((src, dst))
        self._check_capacity()

    def _check_capacity(self) -> None:
        assert len(self._pending) <= self.capacity  # ok: FC109

    def has_pending(self) -> bool:
        return bool(self._pending)

    def pending_arrays(self):
        if not self._pending:
            empty = np.zeros(0, dtype=np.int32)
            return empty, empty
        arr = np.asarray(self._pending, dtype=np.int32)
        return arr[:, 0].copy(), arr[:, 1].copy()

    def publish(self) -> None:
        """The copies have landed: later page lists name the new pages directly."""
        self.map_np[:] = np.arange(self.capacity, dtype=np.int32)
        self.map_gpu.copy_(torch.from_numpy(self.map_np), non_blocking=True)
        self.pending_gpu.zero_()
        self._pending.clear()
