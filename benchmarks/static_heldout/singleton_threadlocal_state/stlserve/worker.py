"""The worker thread pool.

``WorkerPool`` (a process singleton) owns a ``ThreadPoolExecutor`` whose initializer pins each thread to a device.
A thread builds everything else lazily the first time it runs a step: its ``DecodeWorker`` (kept in the
thread-local), its FlashInfer wrappers and its graph runner, which records each decode bucket on first sight.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, List, Optional, Sequence

import torch

from stl_attn.flashinfer_backend import FlashInferBackend
from stlserve.batch import ForwardBatch, ForwardMode, Request
from stlserve.config import EngineConfig
from stlserve.model import ModelHolder
from stlserve.sampler import Sampler, StepStats
from stlserve.thread_state import _TLS, ThreadState


class StepOutput:
    """What a worker hands back for one shard; built once per step."""

    def __init__(self, req_ids: List[int], next_ids: torch.Tensor, stream: torch.cuda.Stream) -> None:
        self.req_ids = req_ids
        self.next_ids = next_ids
        self.logprobs = torch.zeros(len(req_ids), dtype=torch.float32, device=next_ids.device)  # ok: FC107
        self.next_ids_host = torch.empty(len(req_ids), dtype=torch.int64, pin_memory=True)
        self.next_ids_host.copy_(next_ids, non_blocking=True)  # ok: FC101
        self.done = torch.cuda.Event()
        self.done.record(stream)


class DecodeWorker:
    """Per-thread step driver. Never shared: ``for_thread()`` returns the calling thread's own."""

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.model = ModelHolder.model_for(device)
        self.runner = ThreadState.graph_runner()
        self._ids_pinned = torch.empty(cfg.max_num_tokens, dtype=torch.int64, pin_memory=True)
        self._lse_scratch: Optional[torch.Tensor] = None
        self._prefill_tokens = 0
        self._decode_tokens = 0
        self._graph_steps = 0

    @classmethod
    def for_thread(cls) -> "DecodeWorker":
        worker = _TLS.worker
        if worker is None:
            worker = cls(EngineConfig.get_instance(), ThreadState.device())
            _TLS.worker = worker
        return worker

    @staticmethod
    def run_on_thread(reqs: Sequence[Request], mode: ForwardMode) -> StepOutput:
        return DecodeWorker.for_thread().run_step(reqs, mode)

    @staticmethod
    def warm_thread() -> int:
        """Record every bucket on the calling thread ahead of traffic; returns how many were recorded."""
        runner = DecodeWorker.for_thread().runner
        recorded = 0
        for bs in runner.buckets:
            if bs not in runner.entries:
                runner.record_bucket(bs)
                recorded += 1
        return recorded

    def _pinned_ids(self, n: int) -> torch.Tensor:
        if n > self._ids_pinned.numel():
            self._ids_pinned = torch.empty(2 * n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        return self._ids_pinned

    # -- one step -----------------------------------------------------------------------------------------------

    def run_step(self, reqs: Sequence[Request], mode: ForwardMode) -> StepOutput:
        n_ids = len(reqs) if mode == ForwardMode.DECODE else sum(r.seq_len - r.cached_len for r in reqs)
        batch = ForwardBatch.from_requests(reqs, mode, self.device, self._pinned_ids(n_ids))
        ThreadState.set_batch(batch)
        stream = ThreadState.stream()
        with torch.cuda.stream(stream):
            if batch.is_decode and self.runner.can_run(batch.batch_size):
                logits = self._run_graph(batch)
                self._decode_tokens += ThreadState.num_tokens_host()
            else:
                logits = self._run_eager(batch)
            logits = logits[: batch.batch_size]
            next_ids = Sampler.get_instance().sample(logits, batch)
            out = StepOutput(batch.req_ids, next_ids, stream)
            self._logprobs_into(out, logits, next_ids)
        StepStats.record(batch)
        if not batch.is_decode:
            # prefill results go straight to the detokenizer for time-to-first-token
            _TLS.stream.synchronize()  # expect: FC101
        return out

    def _logprobs_into(self, out: StepOutput, logits: torch.Tensor, next_ids: torch.Tensor) -> None:
        if self._lse_scratch is None:
            self._lse_scratch = torch.empty(self.cfg.max_batch_size, dtype=torch.float32, device=self.device)  # ok: FC107
        n = next_ids.numel()
        lse = self._lse_scratch[:n]
        torch.logsumexp(logits.float(), dim=-1, out=lse)
        out.logprobs.copy_(logits.float().gather(-1, next_ids[:, None]).squeeze(-1) - lse)

    def _run_graph(self, batch: ForwardBatch) -> torch.Tensor:
        runner = ThreadState.graph_runner()
        bs = runner.bucket_for(batch.batch_size)
        if bs not in runner.entries:
            runner.record_bucket(bs)
        runner.load_step(batch)
        self._stage_positions(batch, bs)
        StepStats.note_pages(batch)
        self._graph_steps += 1
        return runner.replay(bs, batch.batch_size)

    def _stage_positions(self, batch: ForwardBatch, bs: int) -> None:
        entry = ThreadState.graph_runner().entries[bs]
        # keep a private copy: the uploader reuses the batch's positions buffer for the next step
        entry.static_positions = batch.positions.clone()  # expect: FC107

    def _run_eager(self, batch: ForwardBatch) -> torch.Tensor:
        FlashInferBackend.get_instance().init_forward_metadata(batch)
        if not batch.is_decode:
            self._prefill_tokens += ThreadState.num_tokens()
        return self.model(batch)

    def counters(self) -> dict:
        return {
            "prefill_tokens": self._prefill_tokens,
            "decode_tokens": self._decode_tokens,
            "graph_steps": self._graph_steps,
        }


def _init_worker_thread(devices: "queue.Queue[torch.device]") -> None:
    device = devices.get()
    devices.put(device)  # threads are spread round-robin over the devices
    ThreadState.bind_device(device)


class WorkerPool:
    _instance: ClassVar[Optional["WorkerPool"]] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def get_instance(cls) -> "WorkerPool":
        if cls._instance is None:
            with cls._lock:
                if cls._instance is None:
                    cls._instance = cls(EngineConfig.get_instance())
        return cls._instance

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        devices: "queue.Queue[torch.device]" = queue.Queue()
        for name in cfg.devices:
            devices.put(torch.device(name))
        self.executor = ThreadPoolExecutor(
            max_workers=cfg.num_workers,
            thread_name_prefix="stl-worker",
            initializer=_init_worker_thread,
            initargs=(devices,),
        )

    def warm_up(self) -> int:
        """Best effort: the executor may hand two warm-ups to one thread; the rest record lazily."""
        futures = [self.executor.submit(DecodeWorker.warm_thread) for _ in range(self.cfg.num_workers)]
        return sum(f.result() for f in futures)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True)
        with WorkerPool._lock:
            WorkerPool._instance = None
