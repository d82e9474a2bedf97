"""Admission and batching: at most ``num_slots - 1`` distinct adapters per step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Deque, Dict, List

from loraslots.config import SlotConfig
from loraslots.kvpool import PagePool
from loraslots_rt.batch import Request


@dataclass
class StepPlan:
    decode: List[Request] = field(default_factory=list)
    prefill: List[Request] = field(default_factory=list)

    @property
    def adapter_ids(self) -> List[int]:
        return [r.adapter_id for r in self.decode + self.prefill]


class LoraScheduler:
    def __init__(self, cfg: SlotConfig, pool: PagePool) -> None:
        self.cfg = cfg
        self.pool = pool
        self.reserve_pages = cfg.max_batch
        self.free_cache_slots: List[int] = list(range(cfg.max_batch - 1, -1, -1))

    def schedule(self, waiting: Deque[Request], running: Dict[int, Request]) -> StepPlan:
        plan = StepPlan()
        adapters = set()
        budget = self.cfg.num_slots - 1
        for r in running.values():
            if len(plan.decode) == self.cfg.max_batch:
                break
            if r.adapter_id >= 0 and r.adapter_id not in adapters and len(adapters) == budget:
                continue
            if r.adapter_id >= 0:
                adapters.add(r.adapter_id)
            self.pool.grow(r.rid)
            plan.decode.append(r)
        tokens = 0
        while waiting and self.free_cache_slots:
            r = waiting[0]
            new_adapter = r.adapter_id >= 0 and r.adapter_id not in adapters
            if new_adapter and len(adapters) == budget:
                break
            if tokens + len(r.prompt) > self.cfg.max_prefill_tokens:
                break
            if self.pool.num_free() - self.reserve_pages < len(r.prompt) // self.cfg.page_size + 1:
                break
            waiting.popleft()
            self.pool.admit(r.rid, len(r.prompt))
            r.cache_slot = self.free_cache_slots.pop()
            if r.adapter_id >= 0:
                adapters.add(r.adapter_id)
            tokens += len(r.prompt)
            plan.prefill.append(r)
        self._check_budget()
        return plan

    def finish(self, r: Request) -> None:
        self.pool.release(r.rid)
        self.free_cache_slots.append(r.cache_slot)

    def _check_budget(self) -> None:
        assert self.pool.num_free() >= 0, "page pool accounting went negative"  # ok: FC109
