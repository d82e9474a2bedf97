import collections
import logging
import queue

import numpy as np
import torch

import flashcheck
from overlap_rt.attention import OverlapAttention
from overlap_rt.graphs import StepGraphs
from overlap_rt.metadata import StepMetadataBuilder
from overlap_rt.model import OverlapModel
from overlap_rt.sampler import Sampler
from overlapserve.detok.worker import DetokWorker
from overlapserve.output import PinnedOutputRing
from overlapserve.requests import StopChecker
from overlapserve.settings import ServeSettings

logger = logging.getLogger(__name__)


class OverlapScheduler:
    def __init__(self, settings: ServeSettings, tokenizer, emit, device="cuda"):
        s = settings
        self.settings = s
        self.device = torch.device(device)
        kv_cache = torch.zeros(
            (s.num_layers, s.max_pages, 2, s.page_size, s.num_kv_heads, s.head_dim),
            dtype=torch.bfloat16,
            device=self.device,
        )
        self.page_table_np = np.zeros((s.max_batch, 8192), dtype=np.int32)
        self.attn = OverlapAttention(s, kv_cache, self.device)
        self.model = OverlapModel(s, self.attn).to(self.device)
        self.builder = StepMetadataBuilder(s, self.attn, self.page_table_np, self.device)
        self.graphs = StepGraphs(self.model, self.attn, s, self.device)
        self.sampler = Sampler(s, self.attn, self.device)
        self.ring = PinnedOutputRing(s.max_batch, s.ring_depth, self.device)
        self.stop_checker = StopChecker()
        self.detok = DetokWorker(self.ring, tokenizer, self.stop_checker, emit)
        self.waiting = collections.deque()
        self.running = {}
        self.next_meta = None
        self.debug_overlap = False

    def start(self):
        self.graphs.record_all()
        self.detok.start()

    def add_request(self, req):
        self.stop_checker.add(req.rid, req.stop)
        self.detok.register(req)
        self.waiting.append(req)

    @flashcheck.hot_path
    def run_step(self):
        meta = self.next_meta if self.next_meta is not None else self.builder.build(self._schedule())
        if meta is None:
            return 0
        bs = meta.bs
        if self.debug_overlap and meta.bucket:
            logger.info("in-flight plan state: %s", self.attn.snapshot_wrapper_state(meta.bucket))
        if meta.bucket:
            logits = self.graphs.replay(meta)
        else:
            logits = self.model(meta.input_ids, meta.positions, meta)
        out = self.sampler.sample(logits, bs, prompt_logprobs=self.settings.prompt_logprobs and not meta.is_decode)
        self._advance_device_state(bs)

        slot = self.ring.take_slot()
        host_ids = self.ring.host_ids[slot]
        ev = self.ring.events[slot]
        self.ring.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.ring.copy_stream):
            host_ids[:bs].copy_(out.next_ids, non_blocking=True)
            ev.record(self.ring.copy_stream)
        logger.debug("step launched bs=%d ids=%s", bs, out.next_ids)  # ok: FC101
        if self.settings.early_eos_check:
            eos_rows = [i for i, t in enumerate(host_ids[:bs].tolist()) if t == self.settings.eos_token_id]  # expect: FC101
            for i in eos_rows:
                self.running[meta.rids[i]].finished = True
        self.detok.submit(slot, meta.rids, bs)

        # the overlap: schedule and build step N+1 on the host while step N is still on the GPU
        self._collect_finished()
        self.next_meta = self.builder.build(self._schedule())
        return bs

    def _advance_device_state(self, bs):
        # decode adds one token per row: advance the last-page lengths on the device so the next step
        # need not wait for the host
        lp = self.attn.kv_last_page_len[:bs]
        lp.remainder_(self.settings.page_size).add_(1)  # expect: FC104

    def _schedule(self):
        while self.waiting and len(self.running) < self.settings.max_batch:
            req = self.waiting.popleft()
            req.row = len(self.running)
            self.running[req.rid] = req
        return [r for r in self.running.values() if not r.finished]

    def _collect_finished(self):
        while True:
            try:
                rid = self.detok.finished.get_nowait()
            except queue.Empty:
                return
            req = self.running.pop(rid, None)
            if req is not None:
                req.finished = True
                req.finish_reason = "stop"
            self.stop_checker.drop(rid)
