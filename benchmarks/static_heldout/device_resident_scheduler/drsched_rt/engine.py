"""The serving loop.  Arrivals are pushed to the device queue; admission, page pops and page
releases run on the GPU; the host reads the counters through a pinned mirror one step late."""

from __future__ import annotations

import dataclasses
import logging
import queue as _queue
import threading
from typing import List

import torch

from drsched.config import SchedConfig
from drsched.counters import AdmissionCounters, CountMirror
from drsched.device_queue import DeviceRequestQueue
from drsched.freelist import DevicePageFreeList
from drsched_rt.attention import ResidentAttnBackend
from drsched_rt.graphs import BucketGraphRunner
from drsched_rt.model import ResidentModel
from drsched_rt.scheduler import DeviceScheduler, HostRequest, StepPlan

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class EngineStats:
    steps: int = 0
    steps_with_backlog: int = 0
    tokens_out: int = 0


class ResidentEngine:
    def __init__(self, cfg: SchedConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.queue = DeviceRequestQueue(cfg.queue_capacity, device)
        self.freelist = DevicePageFreeList(cfg.num_pages, device)
        self.counters = AdmissionCounters.allocate(device)
        self.mirror = CountMirror(device)
        self.backend = ResidentAttnBackend(cfg, self.freelist, device)
        self.model = ResidentModel(cfg, self.backend, device)
        self.scheduler = DeviceScheduler(
            cfg, self.queue, self.freelist, self.counters, self.mirror, self.backend, device
        )
        self.graph_runner = BucketGraphRunner(self.model, self.backend, cfg, device)
        self.last_tokens = torch.zeros(cfg.max_running, dtype=torch.int64, device=device)
        self.tokens_pinned = torch.zeros(cfg.max_running, dtype=torch.int64, pin_memory=True)
        self.finished_pinned = torch.zeros(cfg.max_running, dtype=torch.bool, pin_memory=True)
        self.stats = EngineStats()
        self.inbox: List[HostRequest] = []
        self.inbox_lock = threading.Lock()
        self.out_q: "_queue.Queue[StepPlan]" = _queue.Queue()
        self.step_done = threading.Semaphore(1)
        self.results: "_queue.Queue[tuple]" = _queue.Queue()

    def start(self) -> None:
        self.graph_runner.capture_all()
        self._out_thread = threading.Thread(target=self._output_loop, daemon=True)
        self._out_thread.start()

    def add_request(self, rid: int, prompt_ids: List[int], max_new_tokens: int) -> None:
        req = HostRequest(rid=rid, prompt_len=len(prompt_ids), max_new_tokens=max_new_tokens, prompt_ids=prompt_ids)
        with self.inbox_lock:
            self.inbox.append(req)

    def step(self) -> None:
        self.step_done.acquire()  # released by the output thread once the mirror has landed
        with self.inbox_lock:
            arrivals, self.inbox = self.inbox, []
        self.scheduler.enqueue(arrivals)
        plan = self.scheduler.schedule_step()
        self.backend.init_forward_metadata(plan)
        if plan.num_prefill:
            self._run_prefill(plan)
        if plan.num_decode:
            n = plan.num_decode
            slots = self.backend.decode_slots[:n]
            input_ids = self.last_tokens.index_select(0, slots)
            positions = self.backend.decode_seq_lens[:n].to(torch.int64) - 1
            if plan.bucket is not None:
                logits = self.graph_runner.replay(plan, input_ids, positions)
            else:
                logits = self.model.forward_decode(input_ids, positions, n)
            next_tok = torch.argmax(logits, dim=-1)
            self.last_tokens.index_copy_(0, slots, next_tok)
            finished = next_tok == self.cfg.eos_token_id
            done_slots = slots[finished]  # expect: FC101
            pages = self.backend.block_table.index_select(0, done_slots).flatten()
            self.freelist.release(pages, pages > 0)
            self.counters.record_finish(finished.sum())
            self.tokens_pinned[:n].copy_(next_tok, non_blocking=True)
            self.finished_pinned[:n].copy_(finished, non_blocking=True)
        if self.queue.has_waiting:  # expect: FC101
            self.stats.steps_with_backlog += 1
        self.mirror.publish(self.counters, self.freelist.top)
        self.scheduler.on_step_done(plan)
        self.stats.steps += 1
        self.out_q.put(plan)

    def _run_prefill(self, plan: StepPlan) -> None:
        reqs = self.scheduler.prefill_requests()
        ids_cpu = torch.tensor([t for r in reqs for t in r.prompt_ids], dtype=torch.int64)
        pos_cpu = torch.cat([torch.arange(r.prompt_len, dtype=torch.int64) for r in reqs])
        self.backend.alloc_prefill_pages(plan)
        logits = self.model.forward_prefill(
            ids_cpu.to(self.device, non_blocking=True), pos_cpu.to(self.device, non_blocking=True)
        )
        last_idx = (plan.qo_indptr[1:] - 1).long()
        first_tok = torch.argmax(logits.index_select(0, last_idx), dim=-1)
        self.last_tokens.index_copy_(0, self.backend.prefill_slots[: plan.num_prefill], first_tok)

    def _output_loop(self) -> None:
        while True:
            plan = self.out_q.get()
            self.mirror.wait_landed()
            n = plan.num_decode
            tokens = self.tokens_pinned[:n].tolist()
            finished = self.finished_pinned[:n].tolist()
            slots = plan.decode_slots_cpu[:n].tolist()
            self.step_done.release()
            done_rids = []
            for slot, tok, fin in zip(slots, tokens, finished):
                self.results.put((slot, tok))
                if fin:
                    done_rids.append(slot)
            self.stats.tokens_out += len(tokens)
            if done_rids:
                self.scheduler.retire_slots(done_rids)
                logger.info("finished %d requests", len(done_rids))
