"""FCFS scheduler: prefill new requests, otherwise decode every running one; one step at a time."""

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List, Optional, Tuple

from hookmeta.config import EngineConfig, ceil_div
from hookmeta.forward_batch import ForwardMode
from hookmeta.model_runner import ModelRunner


@dataclass
class Request:
    rid: str
    prompt_ids: List[int]
    max_new_tokens: int
    eos_token_id: int
    output_ids: List[int] = field(default_factory=list)
    page_ids: List[int] = field(default_factory=list)
    prefilled: bool = False

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        if len(self.output_ids) >= self.max_new_tokens:
            return True
        return bool(self.output_ids) and self.output_ids[-1] == self.eos_token_id


class PageAllocator:
    def __init__(self, num_pages: int):
        self.free: List[int] = list(range(num_pages - 1, -1, -1))

    def grow(self, req: Request, page_size: int) -> bool:
        need = ceil_div(req.seq_len + 1, page_size) - len(req.page_ids)
        if need > len(self.free):
            return False
        for _ in range(need):
            req.page_ids.append(self.free.pop())
        return True

    def release(self, req: Request) -> None:
        self.free.extend(req.page_ids)
        req.page_ids.clear()


class Scheduler:
    def __init__(self, cfg: EngineConfig, runner: Optional[ModelRunner] = None):
        self.cfg = cfg
        self.runner = runner or ModelRunner(cfg)
        self.pages = PageAllocator(cfg.max_num_pages)
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self.finished: List[Request] = []

    def add_request(self, req: Request) -> None:
        if len(req.prompt_ids) + req.max_new_tokens > self.cfg.max_context_len:
            raise ValueError(f"request {req.rid} needs more than max_context_len={self.cfg.max_context_len}")
        self.waiting.append(req)

    def _schedule(self) -> Tuple[List[Request], ForwardMode]:
        budget = self.cfg.max_num_tokens
        prefill: List[Request] = []
        while self.waiting and len(self.running) + len(prefill) < self.cfg.max_batch_size:
            req = self.waiting[0]
            if len(req.prompt_ids) > budget or not self.pages.grow(req, self.cfg.page_size):
                break
            budget -= len(req.prompt_ids)
            prefill.append(self.waiting.popleft())
        if prefill:
            return prefill, ForwardMode.EXTEND
        decode = [r for r in self.running if self.pages.grow(r, self.cfg.page_size)]
        return decode, ForwardMode.DECODE

    def step(self) -> bool:
        reqs, mode = self._schedule()
        if not reqs:
            return False
        if mode is ForwardMode.EXTEND:
            token_ids = [r.prompt_ids for r in reqs]
        else:
            token_ids = [[r.output_ids[-1]] for r in reqs]
        next_ids_cpu, done = self.runner.execute_step(
            token_ids, [r.seq_len for r in reqs], [r.page_ids for r in reqs], mode
        )
        done.synchronize()
        for req, token in zip(reqs, next_ids_cpu[: len(reqs)].tolist()):  # ok: FC101
            req.output_ids.append(token)
            if not req.prefilled:
                req.prefilled = True
                self.running.append(req)
        for req in [r for r in self.running if r.finished]:
            self.running.remove(req)
            self.pages.release(req)
            self.finished.append(req)
        return True

    def run_until_idle(self) -> List[Request]:
        while self.waiting or self.running:
            if not self.step():
                break
        return self.finished
