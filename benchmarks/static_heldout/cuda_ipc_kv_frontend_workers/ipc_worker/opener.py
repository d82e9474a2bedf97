"""Opens the frontend's page pool in a worker process from its IPC handle."""

from typing import Dict

import torch

from ipckv import IpcHandle, IpcServeConfig


class PoolOpener:
    def __init__(self, cfg: IpcServeConfig, device_index: int):
        self.cfg = cfg
        self.device_index = device_index
        self._backend = "cuda_ipc"
        self._opened: Dict[int, torch.Tensor] = {}

    def open(self, handle: IpcHandle, expected_pages: int) -> torch.Tensor:
        assert handle.num_pages == expected_pages, "frontend exported a pool of another size"  # expect: FC109
        storage = torch.UntypedStorage._new_shared_cuda(*handle.share_args())
        dtype = getattr(torch, handle.dtype)
        kv = torch.empty(0, dtype=dtype, device=f"cuda:{self.device_index}")
        kv.set_(storage, 0, handle.shape)
        self._opened[handle.generation] = kv
        return kv

    def current(self, generation: int) -> torch.Tensor:
        self._check_open()
        return self._opened[generation]

    def _check_open(self) -> None:
        assert self._opened, "no pool generation opened yet"  # ok: FC109

    def describe(self) -> str:
        return f"{self._backend}:{self.device_index}:{sorted(self._opened)}"  # ok: FC103
