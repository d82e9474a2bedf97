"""Per-step scheduling against device-resident state.

Admission runs as device ops (no host round trip): the host only pushes arrivals and reads the
counters through ``CountMirror``, which lands one step late.  The host keeps the arrival order
itself, so a count of admitted requests is enough to know *which* requests were admitted."""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
from typing import Deque, List, Optional

import numpy as np
import torch

from drsched.config import SchedConfig
from drsched.counters import ADMITTED, AdmissionCounters, CountMirror
from drsched.device_queue import PAGES_NEEDED, ROW_WIDTH, DeviceRequestQueue
from drsched.freelist import DevicePageFreeList

logger = logging.getLogger(__name__)


class Phase(enum.Enum):
    WAITING = 0
    PREFILL = 1
    DECODE = 2


@dataclasses.dataclass
class HostRequest:
    rid: int
    prompt_len: int
    max_new_tokens: int
    slot: int = -1
    seq_len: int = 0
    generated: int = 0
    phase: Phase = Phase.WAITING
    prompt_ids: List[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class StepPlan:
    num_decode: int
    num_prefill: int
    bucket: Optional[int]
    max_seq_len: int
    decode_slots_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor
    flat_page_idx_cpu: torch.Tensor
    prefill_slots_cpu: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    prefill_kv_indptr_cpu: torch.Tensor
    prefill_last_page_len_cpu: torch.Tensor
    prefill_flat_idx_cpu: torch.Tensor


class PrefixOffloader:
    """Host side of the prefix cache's CPU tier: pages whose contents were copied out are returned
    to the device free-list in batches."""

    def __init__(self):
        self.returned: List[int] = []

    def take_returned(self) -> torch.Tensor:
        pages, self.returned = self.returned, []
        return torch.tensor(pages, dtype=torch.int32)


class DeviceScheduler:
    def __init__(
        self,
        cfg: SchedConfig,
        queue: DeviceRequestQueue,
        freelist: DevicePageFreeList,
        counters: AdmissionCounters,
        mirror: CountMirror,
        backend,
        device: torch.device,
    ):
        assert backend.page_size == cfg.page_size, "backend planned for another page size"  # expect: FC109
        self.cfg = cfg
        self.queue = queue
        self.freelist = freelist
        self.counters = counters
        self.mirror = mirror
        self.backend = backend
        self.device = device
        self.page_size = cfg.page_size
        self.offloader = PrefixOffloader()

        self.pending_host: Deque[HostRequest] = collections.deque()
        self.running: List[HostRequest] = []
        self.free_slots: List[int] = list(range(cfg.max_running - 1, 0, -1))  # slot 0: padding
        self.admitted_seen = 0
        self._admit_scratch: Optional[torch.Tensor] = None
        self._plan_info = None

        n = cfg.max_running
        total_pages = cfg.max_running * cfg.max_pages_per_req
        self.kv_indptr_pinned = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_pinned = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.flat_idx_pinned = torch.zeros(total_pages, dtype=torch.int64, pin_memory=True)
        self.slots_pinned = torch.zeros(n, dtype=torch.int64, pin_memory=True)
        self.seq_lens_pinned = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_pinned = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.pf_kv_indptr_pinned = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.pf_last_pinned = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.pf_flat_idx_pinned = torch.zeros(total_pages, dtype=torch.int64, pin_memory=True)
        self.pf_slots_pinned = torch.zeros(n, dtype=torch.int64, pin_memory=True)
        # device copy of the prefill query layout, used by the model's ragged token packing
        self.qo_indptr_dev = torch.zeros(n + 1, dtype=torch.int32, device=device)

    # ------------------------------------------------------------------ host inbox
    def enqueue(self, reqs: List[HostRequest]) -> None:
        if not reqs:
            return
        rows = torch.zeros(len(reqs), ROW_WIDTH, dtype=torch.int64)
        for i, r in enumerate(reqs):
            rows[i, 0] = r.rid
            rows[i, 1] = r.prompt_len
            rows[i, PAGES_NEEDED] = (r.prompt_len + r.max_new_tokens + self.page_size - 1) // self.page_size
        self.queue.push(rows)
        self.counters.record_push(len(reqs))
        self.pending_host.extend(reqs)

    # ------------------------------------------------------------------ per step
    def schedule_step(self) -> StepPlan:
        # what the device admitted up to the previous step; the mirror has landed (CountMirror)
        total_admitted = int(self.mirror.counts_pinned[ADMITTED])  # ok: FC101
        newly = total_admitted - self.admitted_seen
        self.admitted_seen = total_admitted
        admitted = [self.pending_host.popleft() for _ in range(newly)]

        if self.freelist.num_free < self.cfg.low_watermark_pages:
            self._reclaim_offloaded_pages()

        self._admit_on_device()
        logger.debug("queue depth after admission: %s", self.queue.depth)  # ok: FC101

        for r in admitted:
            r.slot = self.free_slots.pop()
            r.phase = Phase.PREFILL
            self.running.append(r)
        prefill_rows = [r for r in self.running if r.phase is Phase.PREFILL]
        decode_rows = [r for r in self.running if r.phase is Phase.DECODE]
        bucket = self._size_bucket(len(decode_rows))
        plan = self._build_plan(decode_rows, prefill_rows, bucket)
        self._plan_info = (plan.num_decode, plan.num_prefill, bucket)  # ok: FC103
        return plan

    def _reclaim_offloaded_pages(self) -> None:
        pages_cpu = self.offloader.take_returned()
        if pages_cpu.numel():
            self.freelist.extend(pages_cpu)

    def _admit_on_device(self) -> None:
        k = self.cfg.admit_window
        window = self.queue.peek_window(k)
        valid = self.queue.window_valid(k)
        need = torch.where(valid, window[:, PAGES_NEEDED], torch.zeros_like(window[:, PAGES_NEEDED]))
        # keep a margin so that decode rows crossing a page never find the stack empty
        budget = self.freelist.top - self.cfg.low_watermark_pages
        fits = (torch.cumsum(need, 0) <= budget) & valid
        # slots left: the host knows its running rows; rows admitted on the device but not yet seen
        # by the host are subtracted on the device too
        room = (self.cfg.max_running - 1 - len(self.running)) - (self.counters.admitted - self.admitted_seen)
        take = fits & (torch.arange(k, device=self.device) < room)
        if self._admit_scratch is None:
            self._admit_scratch = torch.zeros(k, ROW_WIDTH, dtype=torch.int64, device=self.device)  # ok: FC107
        self._admit_scratch.copy_(torch.where(take.unsqueeze(1), window, torch.zeros_like(window)))
        n_admit = take.sum()
        self.queue.pop(n_admit)
        self.counters.record_admission(n_admit)

    def _size_bucket(self, num_decode: int) -> Optional[int]:
        # rows the device admitted this step start decoding soon; size the bucket with room for
        # them so that the graph does not change every other step
        in_flight = int(self.counters.admitted) - self.admitted_seen  # expect: FC101
        return self.cfg.bucket_for(num_decode + min(in_flight, self.cfg.admit_window))

    def _build_plan(
        self, decode_rows: List[HostRequest], prefill_rows: List[HostRequest], bucket: Optional[int]
    ) -> StepPlan:
        ps, mp = self.page_size, self.cfg.max_pages_per_req
        n = len(decode_rows)
        bs = bucket if bucket is not None else n

        seq = np.fromiter((r.seq_len for r in decode_rows), dtype=np.int64, count=n)
        pages = np.ones(bs, dtype=np.int64)  # padded rows: one null page
        pages[:n] = (seq + ps - 1) // ps
        indptr_np = self.kv_indptr_pinned.numpy()[: bs + 1]
        indptr_np[0] = 0
        np.cumsum(pages, out=indptr_np[1:])
        last_np = self.last_page_len_pinned.numpy()[:bs]
        last_np[:] = 1
        last_np[:n] = seq - (pages[:n] - 1) * ps
        flat_np = self.flat_idx_pinned.numpy()
        for i, r in enumerate(decode_rows):
            flat_np[indptr_np[i] : indptr_np[i + 1]] = r.slot * mp + np.arange(pages[i])
        flat_np[indptr_np[n] : indptr_np[bs]] = 0
        slots_np = self.slots_pinned.numpy()
        slots_np[:bs] = 0
        slots_np[:n] = [r.slot for r in decode_rows]
        seq_np = self.seq_lens_pinned.numpy()
        seq_np[:bs] = 1
        seq_np[:n] = seq

        m = len(prefill_rows)
        qo_np = self.qo_indptr_pinned.numpy()[: m + 1]
        qo_np[0] = 0
        np.cumsum([r.prompt_len for r in prefill_rows], out=qo_np[1:])
        pf_pages = np.array([(r.prompt_len + ps - 1) // ps for r in prefill_rows], dtype=np.int64)
        pf_indptr_np = self.pf_kv_indptr_pinned.numpy()[: m + 1]
        pf_indptr_np[0] = 0
        np.cumsum(pf_pages, out=pf_indptr_np[1:])
        pf_last_np = self.pf_last_pinned.numpy()[:m]
        pf_last_np[:] = [r.prompt_len - (p - 1) * ps for r, p in zip(prefill_rows, pf_pages)]
        pf_flat_np = self.pf_flat_idx_pinned.numpy()
        for i, r in enumerate(prefill_rows):
            pf_flat_np[pf_indptr_np[i] : pf_indptr_np[i + 1]] = r.slot * mp + np.arange(pf_pages[i])
        self.pf_slots_pinned.numpy()[:m] = [r.slot for r in prefill_rows]

        qo_indptr = self.qo_indptr_dev[: m + 1]
        qo_indptr.copy_(self.qo_indptr_pinned[: m + 1], non_blocking=True)

        return StepPlan(
            num_decode=n,
            num_prefill=m,
            bucket=bucket,
            max_seq_len=int(seq.max()) if n else 0,
            decode_slots_cpu=self.slots_pinned[:bs],
            seq_lens_cpu=self.seq_lens_pinned[:bs],
            kv_indptr_cpu=self.kv_indptr_pinned[: bs + 1],
            last_page_len_cpu=self.last_page_len_pinned[:bs],
            flat_page_idx_cpu=self.flat_idx_pinned,
            prefill_slots_cpu=self.pf_slots_pinned[:m],
            qo_indptr=qo_indptr,
            qo_indptr_cpu=self.qo_indptr_pinned[: m + 1],
            prefill_kv_indptr_cpu=self.pf_kv_indptr_pinned[: m + 1],
            prefill_last_page_len_cpu=self.pf_last_pinned[:m],
            prefill_flat_idx_cpu=self.pf_flat_idx_pinned,
        )

    def prefill_requests(self) -> List[HostRequest]:
        return [r for r in self.running if r.phase is Phase.PREFILL]

    # ------------------------------------------------------------------ after the step
    def on_step_done(self, plan: StepPlan) -> None:
        for r in self.running:
            if r.phase is Phase.PREFILL:
                r.phase = Phase.DECODE
                r.seq_len = r.prompt_len + 1
            elif r.phase is Phase.DECODE:
                r.seq_len += 1
                r.generated += 1

    def retire_slots(self, slots: List[int]) -> None:
        done = set(slots)
        keep = []
        for r in self.running:
            if r.slot in done:
                self.free_slots.append(r.slot)
            else:
                keep.append(r)
        self.running = keep

    def metrics(self) -> dict:
        return {"last_plan": self._plan_info, "running": len(self.running), "pending": len(self.pending_host)}
