"""Per-step admission: batch slots, the global free-page watermark and per-tenant quotas."""
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from tqp.pages import RefcountedPageTable, TenantQuota


@dataclass
class Request:
    rid: int
    tenant_id: int
    prompt_ids: List[int]
    max_new_tokens: int
    output_ids: List[int] = field(default_factory=list)
    pages: Optional[torch.Tensor] = None       # host page ids, owned or shared
    prefix_pages: Optional[torch.Tensor] = None  # the tenant's shared system prompt pages
    prefilled: bool = False
    finished: bool = False

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def extend_len(self) -> int:
        return 1 if self.prefilled else len(self.prompt_ids)


class AdmissionController:
    def __init__(self, page_table: RefcountedPageTable, quota: TenantQuota, watermark: float):
        assert 0.0 <= watermark < 1.0  # expect: FC109
        self.page_table = page_table
        self.quota = quota
        self.device = page_table.device
        self.page_size = page_table.cfg.page_size
        self.reserve = int(watermark * page_table.cfg.num_pages)
        self.num_tenants = len(quota.names)

    def recount_usage(self, running: List[Request]) -> None:
        owners = [r.tenant_id for r in running for _ in range(r.pages.numel())]
        self.quota.used_cpu.zero_()
        if owners:
            self.quota.used_cpu.index_add_(0, torch.tensor(owners), torch.ones(len(owners), dtype=torch.int64))
        self.quota.used = torch.zeros(self.num_tenants, dtype=torch.int64, device=self.device)  # expect: FC107
        self.quota.used.copy_(self.quota.used_cpu, non_blocking=True)

    def admit(self, waiting: List[Request], running: List[Request], max_bs: int) -> List[Request]:
        self.recount_usage(running)
        free = self.page_table.free_pages
        admitted: List[Request] = []
        for req in list(waiting):
            if len(running) + len(admitted) >= max_bs:
                break
            need = (len(req.prompt_ids) + req.max_new_tokens + self.page_size - 1) // self.page_size
            if need > free - self.reserve:
                break
            tid = req.tenant_id
            if int(self.quota.used_cpu[tid]) + need > int(self.quota.limits_cpu[tid]):  # ok: FC101
                continue  # this tenant is over quota; others may still fit
            own = self.page_table.alloc(tid, need)
            if req.prefix_pages is not None:
                self.page_table.share(req.prefix_pages, tid)
            req.pages = own
            self.quota.used_cpu[tid] += need
            free -= need
            waiting.remove(req)
            admitted.append(req)
        return admitted
