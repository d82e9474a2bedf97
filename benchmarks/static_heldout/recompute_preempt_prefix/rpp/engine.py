from __future__ import annotations

import logging
import queue
import threading
import time

import torch

from rpp.config import EngineConfig
from rpp.sched.request import Request
from rpp.sched.scheduler import Scheduler, SchedulerOutput
from rpp.worker.model import LlamaForCausalLM
from rpp.worker.runner import ModelRunner, ModelRunnerOutput

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        model = LlamaForCausalLM(cfg).to(device=cfg.device, dtype=torch.bfloat16)
        m, c = cfg.model, cfg.cache
        kv_dtype = torch.float8_e4m3fn if c.kv_cache_dtype.startswith("fp8") else torch.bfloat16
        kv_caches = [torch.zeros(c.num_gpu_blocks, 2, c.block_size, m.num_kv_heads, m.head_dim,
                                 dtype=kv_dtype, device=cfg.device) for _ in range(m.num_layers)]
        self.scheduler = Scheduler(cfg.scheduler, cfg.cache)
        self.runner = ModelRunner(cfg, model, kv_caches)
        self.runner.capture_model()
        self.input_queue: queue.Queue[Request] = queue.Queue()
        self.output_queue: queue.Queue[Request] = queue.Queue()
        self._shutdown = threading.Event()

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def step(self) -> tuple[SchedulerOutput, ModelRunnerOutput]:
        sched_out = self.scheduler.schedule()
        out = self.runner.execute_model(sched_out)
        return sched_out, out

    def _process_output(self, sched_out: SchedulerOutput, out: ModelRunnerOutput) -> None:
        # the one host round trip per step, after the step's work is queued
        if out.event is not None:
            out.event.synchronize()
        tokens = out.sampled_cpu[: out.num_sampled].tolist()  # ok: FC101
        sampled = {rid: [t] for rid, t in zip(out.req_ids, tokens)}
        self.runner.record_sampled(sampled)
        for req in self.scheduler.update_from_output(sched_out, sampled):
            self.output_queue.put(req)

    def run_busy_loop(self) -> None:
        while not self._shutdown.is_set():
            while not self.input_queue.empty():
                self.add_request(self.input_queue.get_nowait())
            if not self.scheduler.running and not self.scheduler.waiting:
                time.sleep(0.001)
                continue
            sched_out, out = self.step()
            self._process_output(sched_out, out)
            if self.scheduler.num_preempted_total and self.scheduler.num_preempted_total % 100 == 0:
                logger.warning("%d preemptions so far; prefix hit rate %.2f", self.scheduler.num_preempted_total,
                               self.scheduler.kv_cache_manager.block_pool.hit_rate())
