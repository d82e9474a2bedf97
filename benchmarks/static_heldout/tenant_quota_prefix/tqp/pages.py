"""Refcounted page table shared by all tenants, and per-tenant quotas."""
from typing import Dict, List

import torch

from tqp.config import ServerConfig


class RefcountedPageTable:
    """A page is free when its refcount drops to 0; prefix pages are shared across tenants."""

    def __init__(self, cfg: ServerConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        # the device copy is what the prefix-dedup kernels read
        self.refcount = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.refcount_cpu = torch.zeros(cfg.num_pages, dtype=torch.int32)
        self.owner_cpu = torch.full((cfg.num_pages,), -1, dtype=torch.int32)
        self.tenants: Dict[str, int] = {}
        self._free_list: List[int] = list(range(cfg.num_pages - 1, 0, -1))  # page 0 is the padding page
        self._num_free = len(self._free_list)

    def register_tenant(self, name: str) -> int:
        tid = len(self.tenants)
        self.tenants[name] = tid
        return tid

    @property
    def free_pages(self) -> int:
        return int((self.refcount == 0).sum())  # expect: FC101

    @property
    def free_pages_host(self) -> int:
        return self._num_free

    def alloc(self, tenant_id: int, n: int) -> torch.Tensor:
        if n > self._num_free:
            raise RuntimeError(f"out of KV pages: need {n}, {self._num_free} free")
        pages = self._free_list[-n:]
        del self._free_list[-n:]
        self._num_free -= n
        idx = torch.tensor(pages, dtype=torch.int64)
        self.refcount_cpu[idx] = 1
        self.owner_cpu[idx] = tenant_id
        self.refcount.index_fill_(0, idx.to(self.device, non_blocking=True), 1)
        self._check_accounting()
        return idx

    def share(self, src_pages: torch.Tensor, tenant_id: int) -> torch.Tensor:
        assert tenant_id in self.tenants.values()  # expect: FC109
        self.refcount_cpu[src_pages] += 1
        self.refcount.index_add_(
            0,
            src_pages.to(self.device, non_blocking=True),
            torch.ones(src_pages.numel(), dtype=torch.int32, device=self.device),
        )
        return src_pages

    def count_shared(self, req_pages_gpu: torch.Tensor) -> torch.Tensor:
        """Pages of this batch that another request (of any tenant) also holds."""
        counts = self.refcount[req_pages_gpu]
        return req_pages_gpu[counts > 1]  # expect: FC101

    def release(self, pages: torch.Tensor) -> List[int]:
        self.refcount_cpu[pages] -= 1
        self.refcount.index_add_(
            0,
            pages.to(self.device, non_blocking=True),
            torch.full((pages.numel(),), -1, dtype=torch.int32, device=self.device),
        )
        freed = pages[self.refcount_cpu[pages] == 0].tolist()  # ok: FC101
        self.owner_cpu[freed] = -1
        self._free_list.extend(freed)
        self._num_free += len(freed)
        self._check_accounting()
        return freed

    def _check_accounting(self) -> None:
        assert self._num_free == len(self._free_list)  # ok: FC109


class TenantQuota:
    """Pages each tenant may hold; `used` is recomputed from the running set every step."""

    def __init__(self, cfg: ServerConfig, device: torch.device):
        self.names = list(cfg.tenants)
        self.limits_cpu = torch.tensor([t.max_pages for t in cfg.tenants.values()], dtype=torch.int64)
        self.limits = self.limits_cpu.to(device)
        self.used_cpu = torch.zeros(len(self.names), dtype=torch.int64)
        self.used = torch.zeros(len(self.names), dtype=torch.int64, device=device)

    def headroom_host(self, tenant_id: int) -> int:
        return int(self.limits_cpu[tenant_id] - self.used_cpu[tenant_id])
