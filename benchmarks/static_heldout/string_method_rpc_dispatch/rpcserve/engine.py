"""Engine core: schedules on the host and drives the executor by RPC name every step."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass, field

from .config import EngineConfig
from .executor import EXECUTORS
from .rpc import ADMIN_RPC_METHODS

logger = logging.getLogger(__name__)


@dataclass
class Request:
    req_id: str
    token_ids: list[int]
    temperature: float = 0.0
    max_tokens: int = 256
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    spec_token_ids: list[int] = field(default_factory=list)
    finished: bool = False


@dataclass
class SchedulerOutput:
    req_ids: list[str]
    num_scheduled_tokens: dict[str, int]
    num_computed_tokens: list[int]
    token_ids: list[list[int]]
    block_tables: list[list[int]]
    temperatures: list[float]
    spec_token_ids: list[list[int]]
    is_decode_only: bool

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


class Scheduler:
    """Host-only FCFS scheduler with a token budget and a free-page list."""

    def __init__(self, cfg: EngineConfig, num_pages: int) -> None:
        self.cfg = cfg
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_pages = list(range(num_pages))
        self.lock = threading.Lock()

    def add(self, req: Request) -> None:
        with self.lock:
            self.waiting.append(req)

    def _reserve_pages(self, req: Request, num_new_tokens: int) -> bool:
        need = -(-(req.num_computed_tokens + num_new_tokens) // self.cfg.page_size) - len(req.block_ids)
        if need > len(self.free_pages):
            return False
        req.block_ids.extend(self.free_pages.pop() for _ in range(max(need, 0)))
        return True

    def schedule(self) -> SchedulerOutput:
        with self.lock:
            budget = self.cfg.max_num_batched_tokens
            scheduled: list[tuple[Request, int]] = []
            for req in self.running:
                n = 1 + len(req.spec_token_ids)
                if n <= budget and self._reserve_pages(req, n):
                    scheduled.append((req, n))
                    budget -= n
            while self.waiting and budget > 0 and len(scheduled) < self.cfg.max_num_seqs:
                req = self.waiting[0]
                n = min(len(req.token_ids) - req.num_computed_tokens, budget)
                if not self._reserve_pages(req, n):
                    break
                self.waiting.popleft()
                self.running.append(req)
                scheduled.append((req, n))
                budget -= n
            is_decode = all(r.num_computed_tokens >= len(r.token_ids) - 1 for r, _ in scheduled)
            return SchedulerOutput(
                req_ids=[r.req_id for r, _ in scheduled],
                num_scheduled_tokens={r.req_id: n for r, n in scheduled},
                num_computed_tokens=[r.num_computed_tokens for r, _ in scheduled],
                token_ids=[r.token_ids for r, _ in scheduled],
                block_tables=[list(r.block_ids) for r, _ in scheduled],
                temperatures=[r.temperature for r, _ in scheduled],
                spec_token_ids=[list(r.spec_token_ids) for r, _ in scheduled],
                is_decode_only=bool(scheduled) and is_decode,
            )

    def update_from_output(self, sched_out: SchedulerOutput, sampled: list[int]) -> list[str]:
        finished = []
        with self.lock:
            by_id = {r.req_id: r for r in self.running}
            for req_id, tok in zip(sched_out.req_ids, sampled):
                req = by_id[req_id]
                req.num_computed_tokens += sched_out.num_scheduled_tokens[req_id]
                if req.num_computed_tokens >= len(req.token_ids):
                    req.token_ids.append(tok)
                if tok == self.cfg.eos_token_id or len(req.token_ids) >= req.max_tokens:
                    req.finished = True
                    finished.append(req_id)
                    self.free_pages.extend(req.block_ids)
            self.running = [r for r in self.running if not r.finished]
        return finished


class LLMEngine:
    def __init__(self, cfg: EngineConfig, executor_backend: str = "uniproc") -> None:
        self.cfg = cfg
        self.executor = EXECUTORS[executor_backend](cfg)
        num_pages = self.executor.collective_rpc("determine_num_available_pages", unique_reply_rank=0)
        self.executor.collective_rpc("initialize_cache", args=(num_pages,))
        self.executor.collective_rpc("compile_or_warm_up_model")
        self.scheduler = Scheduler(cfg, num_pages)
        self._step = 0
        self._ids = itertools.count()
        self._outputs: queue.Queue = queue.Queue()
        self._output_thread = threading.Thread(target=self._output_loop, name="rpcserve-output", daemon=True)
        self._output_thread.start()

    def add_request(self, prompt_token_ids: list[int], temperature: float = 0.0, max_tokens: int = 256) -> str:
        if not prompt_token_ids:
            raise ValueError("empty prompt")
        req_id = f"req-{next(self._ids)}"
        self.scheduler.add(Request(req_id, list(prompt_token_ids), temperature, max_tokens))
        return req_id

    def step(self) -> int:
        sched_out = self.scheduler.schedule()
        if sched_out.num_reqs == 0:
            return 0
        model_out = self.executor.collective_rpc("execute_model", args=(sched_out,), unique_reply_rank=0)
        sampler_out = self.executor.collective_rpc("sample_tokens", args=(model_out,), unique_reply_rank=0)
        self.executor.collective_rpc("record_step_stats", kwargs={"step": self._step})
        self._outputs.put((sched_out, sampler_out))
        self._step += 1
        return sched_out.num_reqs

    def _output_loop(self) -> None:
        """Runs beside the steps: waits for each step's token copy and updates the scheduler."""
        while True:
            sched_out, out = self._outputs.get()
            out.copy_event.synchronize()  # ok: FC101
            finished = self.scheduler.update_from_output(sched_out, out.token_ids_cpu.tolist())
            if finished:
                logger.debug("finished: %s", finished)

    def admin(self, command: str, *args):
        """Operator commands from the HTTP admin endpoint (GET /debug/<command>)."""
        if command not in ADMIN_RPC_METHODS:
            raise ValueError(f"unknown admin command {command!r}")
        return self.executor.collective_rpc(command, args=args)
