"""Host (pinned) KV pool for pages evicted from the device."""
from __future__ import annotations

import torch


class HostKVPool:
    def __init__(self, device_kv: torch.Tensor, num_host_pages: int) -> None:
        self.device_kv = device_kv
        self.device = device_kv.device
        self.host_kv = torch.empty((num_host_pages,) + tuple(device_kv.shape[1:]), dtype=device_kv.dtype,
                                   pin_memory=True)
        self.next_slot = 0
        self.load_done = torch.cuda.Event()

    def offload(self, dev_pages: torch.Tensor) -> int:
        n = dev_pages.numel()
        start = self.next_slot
        host_view = self.host_kv[start : start + n]
        host_view.copy_(self.device_kv[dev_pages.long()])  # expect: FC101
        self.next_slot += n
        return start

    def load_back(self, host_start: int, dev_pages: torch.Tensor) -> None:
        n = dev_pages.numel()
        staged = self.host_kv[host_start : host_start + n].to(self.device, non_blocking=True)  # ok: FC101
        self.device_kv.index_copy_(0, dev_pages.long(), staged)
        self.load_done.record()
