"""Forms decode batches under a page budget and pads them to a captured bucket."""

from dataclasses import dataclass
from typing import List

import flashcheck
import numpy as np
import torch

from kb_attn.backend import BatcherBackend
from kvbatch.config import BatcherConfig
from kvbatch.cost import CostModel


@dataclass
class FormedBatch:
    slots: List[int]
    num_rows: int
    padded: int
    slot_ids: torch.Tensor  # on the device
    page_counts: torch.Tensor  # on the device
    num_pages_host: int
    budget_left: int
    est_cost_us: float


class KVAwareBatcher:
    def __init__(self, cfg: BatcherConfig, cost_model: CostModel, backend: BatcherBackend, buckets: List[int]):
        assert max(buckets) <= cfg.max_rows, "a graph bucket exceeds the row limit"  # expect: FC109
        self.cfg = cfg
        self.cost_model: CostModel = cost_model
        self.backend = backend
        self.buckets = sorted(buckets)
        self.device = cfg.device
        self._kv_layout = cfg.kv_layout
        self.page_budget = cfg.page_budget
        # device copies, advanced by the append kernel each step; numpy mirrors for the host
        self.kv_lens = torch.zeros(cfg.max_slots, dtype=torch.int32, device=self.device)
        self.pages_dev = torch.zeros(cfg.max_slots, dtype=torch.int32, device=self.device)
        self.kv_lens_np = np.zeros(cfg.max_slots, dtype=np.int64)
        self.pages_np = np.zeros(cfg.max_slots, dtype=np.int64)
        self.over_budget_steps = 0

    def layout(self) -> str:
        return self._kv_layout  # ok: FC103

    def bucket_for(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"{n} rows exceed the largest bucket {self.buckets[-1]}")

    def commit(self, slots: List[int], new_lens: np.ndarray) -> None:
        self.kv_lens_np[slots] = new_lens
        self.pages_np[slots] = (new_lens + self.cfg.page_size - 1) // self.cfg.page_size

    @flashcheck.hot_path
    def form_batch(self, ready: List[int], step_budget_us: float) -> FormedBatch:
        order = sorted(ready, key=lambda s: self.kv_lens_np[s], reverse=True)
        chosen: List[int] = []
        pages = 0
        for s in order:
            need = int(self.pages_np[s]) + 1
            if pages + need > self.page_budget or len(chosen) == self.buckets[-1]:
                break
            chosen.append(s)
            pages += need
        budget_left = self.page_budget - int(self.pages_np[chosen].sum())  # ok: FC101
        n = len(chosen)
        padded = self.bucket_for(n)
        slot_ids = torch.tensor(chosen, dtype=torch.int64).to(self.device, non_blocking=True)
        est = self.cost_model.estimate(self.kv_lens.index_select(0, slot_ids))
        if not self.cost_model.fits(est, step_budget_us):
            self.over_budget_steps += 1  # the scheduler shrinks the next batch
        # padding rows of the bucket read one token of page 0
        self.backend.last_page_len_buf[n:padded].fill_(1)  # expect: FC104
        return FormedBatch(
            slots=chosen,
            num_rows=n,
            padded=padded,
            slot_ids=slot_ids,
            page_counts=self.pages_dev.index_select(0, slot_ids),
            num_pages_host=pages,
            budget_left=budget_left,
            est_cost_us=est,
        )
