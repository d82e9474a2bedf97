"""Token-budget scheduler: running requests first, then waiting ones; a prompt may
be split into chunks; when blocks run out the newest running request is preempted
and recomputed later (its full blocks usually come back as prefix-cache hits)."""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from rpp.config import CacheConfig, SchedulerConfig
from rpp.sched.kv_manager import KVCacheManager
from rpp.sched.request import Request, RequestStatus

logger = logging.getLogger(__name__)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int
    resumed_from_preemption: bool


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: list[CachedRequestData] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    preempted_req_ids: set[str] = field(default_factory=set)
    finished_req_ids: set[str] = field(default_factory=set)
    # requests whose prompt is not finished after this step: no token is sampled for them
    partial_prefill_req_ids: set[str] = field(default_factory=set)


class Scheduler:
    def __init__(self, sched_cfg: SchedulerConfig, cache_cfg: CacheConfig):
        self.cfg = sched_cfg
        self.max_num_seqs = sched_cfg.max_num_seqs
        self.max_model_len = sched_cfg.max_model_len
        self.kv_cache_manager = KVCacheManager(cache_cfg.num_gpu_blocks, cache_cfg.block_size,
                                               cache_cfg.enable_prefix_caching, sched_cfg.max_model_len)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_req_ids: set[str] = set()
        self.num_preempted_total = 0

    def add_request(self, request: Request) -> None:
        assert request.num_prompt_tokens < self.max_model_len, request.request_id  # expect: FC109
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def _preempt_newest(self) -> Request:
        victim = self.running.pop()
        self.kv_cache_manager.free(victim)
        victim.status = RequestStatus.PREEMPTED
        # recompute: forget what was computed, keep the hashes of full blocks so that
        # the blocks still in the cache are found again on resume
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        self.num_preempted_total += 1
        return victim

    def _num_new_tokens(self, req: Request, budget: int) -> int:
        n = req.num_tokens - req.num_computed_tokens
        if 0 < self.cfg.long_prefill_token_threshold < n:
            n = self.cfg.long_prefill_token_threshold
        if not self.cfg.enable_chunked_prefill and n > budget:
            return 0
        return min(n, budget)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        budget = self.cfg.max_num_batched_tokens

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._num_new_tokens(req, budget)
            if n == 0:
                i += 1
                continue
            while True:
                new_blocks = self.kv_cache_manager.allocate_slots(req, n)
                if new_blocks is not None:
                    break
                victim = self._preempt_newest()
                out.preempted_req_ids.add(victim.request_id)
                if victim is req:
                    break
            if req.status == RequestStatus.PREEMPTED:
                break
            out.scheduled_cached_reqs.append(CachedRequestData(
                req.request_id, [b.block_id for b in new_blocks], req.num_computed_tokens, False))
            out.num_scheduled_tokens[req.request_id] = n
            if req.num_computed_tokens + n < req.num_tokens:
                out.partial_prefill_req_ids.add(req.request_id)
            budget -= n
            i += 1

        while self.waiting and budget > 0 and not out.preempted_req_ids:
            if len(self.running) == self.max_num_seqs:
                break
            req = self.waiting[0]
            hits, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(req)
            req.num_computed_tokens = num_hit_tokens
            n = self._num_new_tokens(req, budget)
            if n == 0:
                break
            new_blocks = self.kv_cache_manager.allocate_slots(req, n, hits)
            if new_blocks is None:
                req.num_computed_tokens = 0
                break
            self.waiting.popleft()
            resumed = req.status == RequestStatus.PREEMPTED
            req.status = RequestStatus.RUNNING
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit_tokens
            self.running.append(req)
            block_ids = self.kv_cache_manager.get_block_ids(req.request_id)
            if resumed:
                out.scheduled_cached_reqs.append(CachedRequestData(req.request_id, block_ids, num_hit_tokens, True))
            else:
                out.scheduled_new_reqs.append(NewRequestData(req.request_id, req.all_token_ids, block_ids,
                                                             num_hit_tokens))
            out.num_scheduled_tokens[req.request_id] = n
            if req.num_computed_tokens + n < req.num_tokens:
                out.partial_prefill_req_ids.add(req.request_id)
            budget -= n

        assert len(self.running) <= self.max_num_seqs  # ok: FC109
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
        return out

    def update_from_output(self, sched_out: SchedulerOutput, sampled: dict[str, list[int]]) -> list[Request]:
        finished = []
        for req in list(self.running):
            rid = req.request_id
            n = sched_out.num_scheduled_tokens.get(rid)
            if n is None:
                continue
            req.num_computed_tokens += n
            if rid in sched_out.partial_prefill_req_ids:
                continue
            req.append_output_token_ids(sampled.get(rid, []))
            if req.check_stop(self.max_model_len):
                self.running.remove(req)
                self.kv_cache_manager.free(req)
                self.finished_req_ids.add(rid)
                finished.append(req)
        return finished
