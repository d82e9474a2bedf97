"""Chooses each step's requests under per-tenant quotas, preempting by priority."""

import heapq
import logging
from dataclasses import dataclass, field
from typing import Dict, List

from qos.preempt import PreemptionManager
from qos.requests import Request, RequestState
from qos.tenants import TenantLedger

logger = logging.getLogger(__name__)


@dataclass
class StepPlan:
    decode: List[Request] = field(default_factory=list)
    prefill: List[Request] = field(default_factory=list)
    resumed: List[Request] = field(default_factory=list)
    preempted: List[Request] = field(default_factory=list)


class QoSScheduler:
    def __init__(self, ledger: TenantLedger, preempt: PreemptionManager, num_pages: int, page_size: int,
                 max_batch_size: int, max_prefill_tokens: int):
        self.ledger = ledger
        self.preempt = preempt
        self.free_pages: List[int] = list(range(1, num_pages))
        self.page_size = page_size
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: List[Request] = []
        self.running: List[Request] = []
        self.swapped: List[Request] = []
        self.row_of: Dict[str, int] = {}

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def _pages_needed(self, req: Request, new_tokens: int) -> int:
        have = len(req.pages) * self.page_size
        return max(0, -(-(req.seq_len + new_tokens - have) // self.page_size))

    def _alloc(self, req: Request, n: int) -> bool:
        if n > len(self.free_pages):
            return False
        req.pages.extend(self.free_pages[-n:] if n else [])
        del self.free_pages[len(self.free_pages) - n:]
        return True

    def _preempt_lowest(self, plan: StepPlan, above: int) -> bool:
        victims = [r for r in self.running if r.priority < above]
        if not victims:
            return False
        victim = min(victims, key=lambda r: (r.priority, -r.arrival))
        row = self.row_of.pop(victim.request_id, 0)
        start = row * self.preempt.max_pages_per_req
        self.free_pages.extend(self.preempt.swap_out(victim, range(start, start + len(victim.pages))))
        self.running.remove(victim)
        self.swapped.append(victim)
        plan.preempted.append(victim)
        return True

    def schedule(self) -> StepPlan:
        self.ledger.refill()
        plan = StepPlan()
        # decode rows first, highest priority first, each charged one token
        for req in sorted(self.running, key=lambda r: -r.priority):
            if self.ledger.allowance(req.tenant) < 1.0:
                continue
            need = self._pages_needed(req, 1)
            while need and not self._alloc(req, need):
                if not self._preempt_lowest(plan, req.priority):
                    break
            if len(plan.decode) < self.max_batch_size:
                plan.decode.append(req)
        # bring back swapped requests whose tenant has budget again
        for req in sorted(self.swapped, key=lambda r: -r.priority):
            n = max(1, req.seq_len // self.page_size + 1)
            if self.ledger.allowance(req.tenant) >= 1.0 and n <= len(self.free_pages):
                pages = self.free_pages[-n:]
                del self.free_pages[-n:]
                self.preempt.swap_in(req, pages)
                self.swapped.remove(req)
                self.running.append(req)
                plan.resumed.append(req)
        # admit new prompts by priority under the prefill budget
        heap = [(-r.priority, r.arrival, i, r) for i, r in enumerate(self.waiting)]
        heapq.heapify(heap)
        budget = self.max_prefill_tokens
        while heap and budget > 0:
            _, _, _, req = heapq.heappop(heap)
            if req.prompt_len > budget or self.ledger.allowance(req.tenant) < req.prompt_len:
                continue
            if not self._alloc(req, self._pages_needed(req, 0)):
                break
            budget -= req.prompt_len
            self.waiting.remove(req)
            req.state = RequestState.RUNNING
            plan.prefill.append(req)
        for i, req in enumerate(plan.decode + plan.prefill):
            self.row_of[req.request_id] = i
        logger.debug("step: %d decode, %d prefill, %d preempted", len(plan.decode), len(plan.prefill),
                     len(plan.preempted))
        return plan

    def finish(self, plan: StepPlan) -> None:
        for req in plan.prefill:
            self.running.append(req)
        for req in plan.decode + plan.prefill:
            req.generated += 1
            self.ledger.charge(req.tenant, 1)
