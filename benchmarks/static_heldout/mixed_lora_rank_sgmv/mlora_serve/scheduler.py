"""Adapter-aware scheduling: requests of the same adapter are kept adjacent so SGMV segments stay few."""
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional

import numpy as np
import torch

from mlora.config import EngineConfig


@dataclass
class ScheduledBatch:
    rids: List[int]
    adapter_names: List[str]
    adapter_per_req: List[str]
    input_ids: torch.Tensor
    positions: torch.Tensor
    tokens_per_req_np: np.ndarray
    is_prefill: bool
    page_ids_host: torch.Tensor
    pages_per_req_host: torch.Tensor
    last_len_host: torch.Tensor
    block_table_host: torch.Tensor
    vtok_counts_host: torch.Tensor
    vtok_slots_host: torch.Tensor
    qo_indptr_host: Optional[torch.Tensor] = None
    kv_indptr_host: Optional[torch.Tensor] = None
    max_q: int = 0
    max_kv: int = 0


@dataclass
class LoraRequest:
    rid: int
    adapter: str
    prompt_ids: List[int]
    num_vtokens: int = 0
    vtoken_slot: int = 0
    pages: List[int] = field(default_factory=list)
    output_ids: List[int] = field(default_factory=list)
    seq_len: int = 0


class AdapterAwareScheduler:
    def __init__(self, cfg: EngineConfig, free_pages: List[int], device: torch.device):
        self.cfg = cfg
        self.device = device
        self.free_pages = free_pages
        self.waiting: Deque[LoraRequest] = deque()
        self.running: List[LoraRequest] = []

    def submit(self, req: LoraRequest) -> None:
        self.waiting.append(req)

    def _tables(self, reqs: List[LoraRequest], lens: List[int]):
        ps = self.cfg.page_size
        per_req = [(n + ps - 1) // ps for n in lens]
        width = max(per_req)
        block_table = np.zeros((len(reqs), width), dtype=np.int32)
        for i, (req, k) in enumerate(zip(reqs, per_req)):
            while len(req.pages) < k:
                req.pages.append(self.free_pages.pop())
            block_table[i, :k] = req.pages[:k]
        flat = [p for req, k in zip(reqs, per_req) for p in req.pages[:k]]
        return (
            torch.tensor(flat, dtype=torch.int32),
            torch.tensor(per_req, dtype=torch.int32),
            torch.tensor([(n - 1) % ps + 1 for n in lens], dtype=torch.int32),
            torch.from_numpy(block_table),
        )

    def schedule(self) -> Optional[ScheduledBatch]:
        if self.waiting:
            reqs = []
            while self.waiting and len(reqs) < self.cfg.max_prefill_reqs:
                reqs.append(self.waiting.popleft())
            reqs.sort(key=lambda r: r.adapter)
            lens = [len(r.prompt_ids) for r in reqs]
            page_ids, per_req, last, block_table = self._tables(reqs, lens)
            qo = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
            kv = np.concatenate([[0], np.cumsum(per_req.numpy())]).astype(np.int32)
            ids = [t for r in reqs for t in r.prompt_ids]
            pos = [i for n in lens for i in range(n)]
            for r in reqs:
                r.seq_len = len(r.prompt_ids)
            self.running.extend(reqs)
            self.running.sort(key=lambda r: r.adapter)
            return ScheduledBatch(
                [r.rid for r in reqs], sorted({r.adapter for r in reqs}), [r.adapter for r in reqs],
                torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True),
                torch.tensor(pos, dtype=torch.int64).to(self.device, non_blocking=True),
                np.asarray(lens, dtype=np.int64), True, page_ids, per_req, last, block_table,
                torch.zeros(len(reqs), dtype=torch.int32), torch.zeros(len(reqs), dtype=torch.int32),
                torch.from_numpy(qo), torch.from_numpy(kv), max(lens), max(lens),
            )
        if not self.running:
            return None
        reqs = self.running
        lens = [r.seq_len + 1 for r in reqs]
        page_ids, per_req, last, block_table = self._tables(reqs, lens)
        for r in reqs:
            r.seq_len += 1
        return ScheduledBatch(
            [r.rid for r in reqs], sorted({r.adapter for r in reqs}), [r.adapter for r in reqs],
            torch.tensor([r.output_ids[-1] if r.output_ids else r.prompt_ids[-1] for r in reqs], dtype=torch.int64).to(self.device, non_blocking=True),
            torch.tensor([n - 1 for n in lens], dtype=torch.int64).to(self.device, non_blocking=True),
            np.ones(len(reqs), dtype=np.int64), False, page_ids, per_req, last, block_table,
            torch.tensor([r.num_vtokens for r in reqs], dtype=torch.int32),
            torch.tensor([r.vtoken_slot for r in reqs], dtype=torch.int32),
        )
