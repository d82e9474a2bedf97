"""Per-tenant request queues; the router asks one of them for a batch each step."""
from __future__ import annotations

import collections
import dataclasses
from typing import Deque, Dict, List, Tuple

import numpy as np
import torch

from colo.tenants import StepBatch, TenantKind, TenantSpec


@dataclasses.dataclass
class TenantRequest:
    rid: str
    prompt_ids: List[int]
    output_ids: List[int] = dataclasses.field(default_factory=list)
    pages: List[int] = dataclasses.field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


class PageAllocator:
    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self.free: List[int] = list(range(num_pages - 1, -1, -1))

    def ensure(self, req: TenantRequest) -> None:
        need = (req.seq_len + self.page_size - 1) // self.page_size
        while len(req.pages) < need:
            if not self.free:
                raise MemoryError("tenant KV pool exhausted")
            req.pages.append(self.free.pop())

    def release(self, req: TenantRequest) -> None:
        self.free.extend(req.pages)
        req.pages.clear()


class TenantQueue:
    def __init__(self, spec: TenantSpec):
        self.spec = spec
        self.waiting: Deque[TenantRequest] = collections.deque()
        self.running: List[TenantRequest] = []
        self.pages = PageAllocator(spec.num_pages, spec.page_size)
        self.pending: List[Tuple[List[TenantRequest], torch.Tensor]] = []

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    def submit(self, rid: str, prompt_ids: List[int]) -> None:
        self.waiting.append(TenantRequest(rid, list(prompt_ids)))

    def next_batch(self, device: torch.device) -> StepBatch:
        s = self.spec
        while self.waiting and len(self.running) < s.max_batch_size:
            self.running.append(self.waiting.popleft())
        reqs = list(self.running)
        for r in reqs:
            self.pages.ensure(r)
        lens = np.array([r.seq_len for r in reqs], dtype=np.int32)
        seq_lens_cpu = torch.from_numpy(lens)
        last = (lens - 1) % s.page_size + 1
        pos = lens - 1
        loc = np.array([r.pages[(n - 1) // s.page_size] * s.page_size + (n - 1) % s.page_size for r, n in zip(reqs, lens)])
        if s.kind is TenantKind.GUARD:
            qo = np.zeros(len(reqs) + 1, dtype=np.int32)
            np.cumsum(lens, out=qo[1:])
            qo_cpu = torch.from_numpy(qo)
            ids = [t for r in reqs for t in r.prompt_ids]
        else:
            qo_cpu = None
            ids = [(r.output_ids or r.prompt_ids)[-1] for r in reqs]
        return StepBatch(
            tenant=s.name,
            rids=[r.rid for r in reqs],
            input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
            positions=torch.from_numpy(pos.astype(np.int64)).to(device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            page_lists=[r.pages for r in reqs],
            last_page_len=torch.from_numpy(last).cuda(),
            out_cache_loc=torch.from_numpy(loc).to(device, non_blocking=True),
            qo_indptr_gpu=qo_cpu.to(device) if qo_cpu is not None else None,
            qo_indptr_cpu=qo_cpu,
        )

    def commit(self, batch: StepBatch, next_ids: torch.Tensor) -> None:
        # tokens stay on the device; the detokenizer drains them off the hot path
        self.pending.append((list(self.running[: batch.size]), next_ids))

    def drain(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for reqs, ids in self.pending:
            for r, tok in zip(reqs, ids.tolist()):
                r.output_ids.append(tok)
                out[r.rid] = tok
                if tok == self.spec.eos_token_id:
                    self.running.remove(r)
                    self.pages.release(r)
        self.pending.clear()
        return out
