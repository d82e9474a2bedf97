"""Earliest-deadline-first scheduling with priority preemption."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

import numpy as np

from sloserve.config import GRAPH_BUCKETS, EngineConfig
from sloserve.request import Priority, ReqState, Request
from sloserve.slots import SlotTable


def _validate_buckets(sizes: Sequence[int]) -> None:
    assert list(sizes) == sorted(set(sizes)) and sizes[0] == 1  # ok: FC109


@dataclass
class StepPlan:
    decode_rows: np.ndarray                 # persistent rows, holes included
    decode_seq_lens_np: np.ndarray
    prefill_rows: np.ndarray
    prefill_prefix_np: np.ndarray
    prefill_qo_indptr_np: np.ndarray
    prefill_token_ids: np.ndarray
    needs_compaction: bool = False
    preempted: List[int] = field(default_factory=list)

    @property
    def num_decode(self) -> int:
        return len(self.decode_rows)


class SloScheduler:
    def __init__(self, cfg: EngineConfig, slots: SlotTable):
        _validate_buckets(GRAPH_BUCKETS)
        self.cfg = cfg
        self.slots = slots
        self.waiting: List[tuple] = []          # heap of (deadline, priority, rid)
        self.requests: Dict[int, Request] = {}
        self.running: List[int] = []
        self.max_running = cfg.max_slots

    def add_request(self, req: Request) -> None:
        assert req.ttft_deadline_ms > 0 and len(req.prompt_ids) < self.cfg.max_context_len  # expect: FC109
        self.requests[req.rid] = req
        heapq.heappush(self.waiting, (req.deadline_ms, int(req.priority), req.rid))

    def abort(self, rid: int) -> None:
        req = self.requests.get(rid)
        if req is None or req.state in (ReqState.FINISHED, ReqState.ABORTED):
            return
        req.state = ReqState.ABORTED
        if req.slot is not None:
            self.slots.release(req.slot)
            req.slot = None
        if rid in self.running:
            self.running.remove(rid)

    def _check_invariants(self) -> None:
        assert len(self.running) <= self.max_running  # ok: FC109

    def _preempt_one(self) -> int:
        victim = max(self.running, key=lambda r: (self.requests[r].priority, -self.requests[r].deadline_ms))
        req = self.requests[victim]
        self.slots.release(req.slot)
        req.slot = None
        req.state = ReqState.PREEMPTED
        req.num_computed = 0  # recomputed on resume
        self.running.remove(victim)
        heapq.heappush(self.waiting, (req.deadline_ms, int(req.priority), victim))
        return victim

    def schedule(self, now_ms: float) -> StepPlan:
        cfg = self.cfg
        budget = cfg.max_prefill_tokens
        preempted: List[int] = []
        for rid in list(self.running):
            req = self.requests[rid]
            if len(self.slots.free_pages) < 1 and req.priority == Priority.BATCH:
                preempted.append(self._preempt_one())
        prefill_rows, prefix, qo, toks = [], [], [0], []
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            deadline, _, rid = self.waiting[0]
            req = self.requests[rid]
            if req.state == ReqState.ABORTED or deadline < now_ms - 10_000.0:
                # aborted, or so late that the client has certainly given up
                heapq.heappop(self.waiting)
                req.state = ReqState.ABORTED
                continue
            chunk = req.prompt_ids[req.num_computed : req.num_computed + budget]
            if req.slot is None:
                req.slot = self.slots.admit(rid, len(req.prompt_ids))
            prefill_rows.append(req.slot)
            prefix.append(req.num_computed)
            toks.extend(chunk)
            qo.append(qo[-1] + len(chunk))
            req.num_computed += len(chunk)
            budget -= len(chunk)
            if req.num_computed == len(req.prompt_ids):
                heapq.heappop(self.waiting)
                req.state = ReqState.DECODE
                self.running.append(rid)
            else:
                break
        self._check_invariants()
        rows = np.arange(self.slots.num_rows, dtype=np.int32)
        for r in self.running:
            slot = self.requests[r].slot
            self.slots.reserve(slot, int(self.slots.seq_lens_np[slot]) + 1)
        return StepPlan(
            decode_rows=rows,
            decode_seq_lens_np=self.slots.seq_lens_np[rows].copy(),
            prefill_rows=np.asarray(prefill_rows, dtype=np.int32),
            prefill_prefix_np=np.asarray(prefix, dtype=np.int32),
            prefill_qo_indptr_np=np.asarray(qo, dtype=np.int32),
            prefill_token_ids=np.asarray(toks, dtype=np.int64),
            needs_compaction=self.slots.num_holes > cfg.compaction_threshold * max(self.slots.num_rows, 1),
            preempted=preempted,
        )
