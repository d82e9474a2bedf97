"""Per-step attention metadata for a mixed decode + prefill batch."""

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from qos import Request, StepPlan, TenantLedger


@dataclass
class QoSStepMeta:
    batch_size: int
    num_decode: int
    num_prefill: int
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    prefill_qo_indptr_cpu: torch.Tensor
    prefill_kv_indptr: torch.Tensor
    prefill_last_page_len_cpu: torch.Tensor
    seq_lens: torch.Tensor
    tenant_idx: torch.Tensor
    priority: torch.Tensor
    graph: bool = True
    preempted_rows: Optional[torch.Tensor] = None


@dataclass
class ResumeRows:
    count: int
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor


def _indptr(counts: List[int]) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=out[1:])
    return out


class QoSMetadataBuilder:
    def __init__(self, ledger: TenantLedger, page_size: int, max_context_len: int, device: torch.device):
        self.ledger = ledger
        self.page_size = page_size
        self.max_context_len = max_context_len
        self.device = device

    def _pages(self, reqs: List[Request]):
        indptr = _indptr([len(r.pages) for r in reqs])
        last = np.array([(r.seq_len - 1) % self.page_size + 1 for r in reqs], dtype=np.int32)
        return indptr, last

    def build(self, plan: StepPlan) -> QoSStepMeta:
        dec, pre = plan.decode, plan.prefill
        reqs = dec + pre
        d_indptr, d_last = self._pages(dec)
        p_indptr, p_last = self._pages(pre)
        q_lens = np.array([1] * len(dec) + [r.prompt_len for r in pre], dtype=np.int32)
        pages = [p for r in reqs for p in r.pages]
        indices = torch.tensor(pages or [0], dtype=torch.int32).to(self.device, non_blocking=True)
        seq_lens = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32).to(self.device, non_blocking=True)
        for i, r in enumerate(reqs):
            if r.seq_len > self.max_context_len:
                raise RuntimeError(f"row {i}: seq_len {seq_lens[i]} is over the context limit")  # ok: FC101
        tenant_idx = torch.tensor([self.ledger.index[r.tenant] for r in reqs], dtype=torch.long)
        tenant_idx = tenant_idx.to(self.device, non_blocking=True)
        # prefill tokens are charged by the device-side counts
        self.ledger.charge_device(tenant_idx, torch.from_numpy(q_lens).to(self.device, non_blocking=True))
        prio = torch.tensor(self.ledger.priorities([r.tenant for r in reqs]), dtype=torch.float32)
        meta = QoSStepMeta(
            batch_size=len(reqs),
            num_decode=len(dec),
            num_prefill=len(pre),
            kv_indptr_cpu=torch.from_numpy(d_indptr).pin_memory(),
            kv_indices=indices,
            last_page_len_cpu=torch.from_numpy(d_last).pin_memory(),
            prefill_qo_indptr_cpu=torch.from_numpy(_indptr([r.prompt_len for r in pre])),
            # the page-gather kernel of the prefill reads these offsets on the device
            prefill_kv_indptr=torch.from_numpy(p_indptr + d_indptr[-1]).to(self.device, non_blocking=True),
            prefill_last_page_len_cpu=torch.from_numpy(p_last),
            seq_lens=seq_lens,
            tenant_idx=tenant_idx,
            priority=prio.pin_memory(),
        )
        meta.preempted_rows = torch.zeros(len(reqs), dtype=torch.bool, device=self.device)  # ok: FC107
        return meta

    def build_resume(self, resumed: List[Request]) -> ResumeRows:
        kv_indptr, last = self._pages(resumed)
        pages = [p for r in resumed for p in r.pages]
        return ResumeRows(
            count=len(resumed),
            qo_indptr_cpu=torch.from_numpy(_indptr([r.seq_len for r in resumed])),
            kv_indptr_cpu=torch.from_numpy(kv_indptr).pin_memory(),
            kv_indices=torch.tensor(pages or [0], dtype=torch.int32).to(self.device, non_blocking=True),
            last_page_len_cpu=torch.from_numpy(last),
        )
