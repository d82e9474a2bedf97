"""Engine loop: schedule, build the step on the host mirrors, run eager or replay a graph."""

import bisect
import logging
import queue
import threading

import torch

from engine_rt.attention import HelperAttnBackend
from engine_rt.batch import ForwardBatch, Request
from engine_rt.graph_runner import GraphRunner
from engine_rt.metadata import StepMetadataBuilder
from engine_rt.model import TinyLM
from shmirror.config import EngineConfig
from shmirror.helpers.clamp import check_lens
from shmirror.helpers.indptr import segment_starts
from shmirror.mirrors import MirrorBank

logger = logging.getLogger(__name__)


class FifoScheduler:
    def __init__(self, max_bs: int):
        self.max_bs = max_bs
        self.waiting = []
        self.running = []

    def add(self, req: Request):
        self.waiting.append(req)

    def next_batch(self):
        if self.waiting:
            batch = self.waiting[: self.max_bs]
            del self.waiting[: len(batch)]
            self.running.extend(batch)
            return batch, False
        live = [r for r in self.running if not r.finished]
        self.running = live
        return live[: self.max_bs], True


class HelperEngine:
    def __init__(self, cfg: EngineConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.mirror = MirrorBank(cfg.initial_capacity, cfg.max_total_pages, cfg.max_batch_size, self.device)
        self.builder = StepMetadataBuilder(cfg, self.mirror, self.device)
        self.backend = HelperAttnBackend(cfg, self.mirror, self.device)
        self.model = TinyLM(cfg, self.backend, self.device)
        self.graph_runner = GraphRunner(self.model, self.backend, cfg, self.device)
        self.scheduler = FifoScheduler(cfg.max_batch_size)
        self.next_ids_pinned = torch.zeros(cfg.max_batch_size, dtype=torch.long, pin_memory=True)
        self.copy_done = torch.cuda.Event()
        self.outputs = queue.Queue()
        self.step_id = 0
        self._graph_sizes = sorted(cfg.graph_batch_sizes)
        self._pump = threading.Thread(target=self._drain_outputs, daemon=True)

    def start(self):
        self.graph_runner.capture()
        self._pump.start()

    def _graph_bs(self, bs: int):
        i = bisect.bisect_left(self._graph_sizes, bs)
        return self._graph_sizes[i] if i < len(self._graph_sizes) else None

    def _record_prompt_spans(self, reqs: list, fb: ForwardBatch):
        starts = segment_starts(fb.qo_indptr)
        for r, s in zip(reqs, starts):
            r.prompt_span_start = s

    def step(self) -> int:
        reqs, is_decode = self.scheduler.next_batch()
        if not reqs:
            return 0
        self.step_id += 1
        fb = self.builder.prepare_step(reqs, is_decode)
        check_lens(fb.seq_lens, self.cfg.max_seq_len)
        logger.debug("step %d: seq_lens=%s", self.step_id, fb.seq_lens)  # ok: FC101
        if self.step_id % self.cfg.log_every == 0:
            logger.info(f"step {self.step_id}: longest sequence {fb.seq_lens.max()}")  # expect: FC101
        gbs = self._graph_bs(len(reqs)) if is_decode else None
        if gbs is not None:
            fb.graph_bs = gbs
            logits = self.graph_runner.replay(fb)
        else:
            self.backend.init_forward_metadata(fb)
            logits = self.model.decode(fb) if is_decode else self.model.extend(fb)
        if not is_decode:
            self._record_prompt_spans(reqs, fb)
        bs = len(reqs)
        next_ids = torch.argmax(logits, dim=-1)
        self.next_ids_pinned[:bs].copy_(next_ids, non_blocking=True)
        self.copy_done.record()
        self.outputs.put((self.step_id, reqs, bs))
        return bs

    def _drain_outputs(self):
        while True:
            step_id, reqs, bs = self.outputs.get()
            self.copy_done.synchronize()
            ids = self.next_ids_pinned[:bs].tolist()
            for r, t in zip(reqs, ids):
                r.token_ids.append(t)
                r.seq_len += 1
                r.finished = r.seq_len >= self.cfg.max_seq_len
