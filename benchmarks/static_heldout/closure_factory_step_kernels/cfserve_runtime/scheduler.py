"""The serving loop. It only sees closures: a batch builder, the engine's step function and a token sink."""

from __future__ import annotations

import collections
from typing import Callable, Sequence

from cfserve.batch import ForwardBatch, Request, make_batch_builder
from cfserve.config import EOS_TOKEN_ID
from cfserve_runtime.engine import Engine


def make_token_sink(engine: Engine, eos_id: int = EOS_TOKEN_ID) -> Callable[[Sequence[Request], ForwardBatch], None]:
    """Reads the step's tokens from the engine's pinned buffer once the copy's event has completed."""

    def on_tokens(reqs: Sequence[Request], batch: ForwardBatch) -> None:
        engine.token_ready.synchronize()  # ok: FC101
        toks = engine.token_host[: len(reqs)].tolist()
        for req, tok in zip(reqs, toks):
            if batch.is_extend:
                req.prefilled = req.seq_len
            req.output.append(tok)
            if tok == eos_id or len(req.output) >= req.max_new_tokens:
                req.finished = True

    return on_tokens


class Scheduler:
    def __init__(
        self,
        step_fn: Callable[[ForwardBatch], object],
        build_batch: Callable[[Sequence[Request], bool], ForwardBatch],
        on_tokens: Callable[[Sequence[Request], ForwardBatch], None],
        reserve: Callable[[int, int], None],
        free: Callable[[int], None],
        max_batch: int,
    ):
        self.step_fn = step_fn
        self.build_batch = build_batch
        self.on_tokens = on_tokens
        self.reserve = reserve
        self.free = free
        self.max_batch = max_batch
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.free_slots = list(range(max_batch))

    def submit(self, req: Request) -> None:
        self.waiting.append(req)

    def _admit(self) -> list[Request]:
        admitted = []
        while self.waiting and self.free_slots:
            req = self.waiting.popleft()
            req.pool_idx = self.free_slots.pop()
            self.reserve(req.rid, req.seq_len)
            admitted.append(req)
        return admitted

    def run_once(self) -> bool:
        new = self._admit()
        reqs, is_extend = (new, True) if new else (self.running, False)
        if not reqs:
            return False
        for req in reqs:
            self.reserve(req.rid, req.seq_len)
        batch = self.build_batch(reqs, is_extend)
        self.step_fn(batch)
        self.on_tokens(reqs, batch)
        if is_extend:
            self.running.extend(new)
        for req in [r for r in self.running if r.finished]:
            self.running.remove(req)
            self.free_slots.append(req.pool_idx)
            self.free(req.rid)
        return True

    def run(self) -> None:
        while self.run_once():
            pass


def serve(engine: Engine, requests: Sequence[Request]) -> list[Request]:
    sched = Scheduler(
        engine.make_step_fn(),
        make_batch_builder(engine.cfg, engine.device, engine.pool.pages_of),
        make_token_sink(engine),
        engine.pool.reserve,
        engine.pool.free_request,
        engine.cfg.max_batch_size,
    )
    for req in requests:
        sched.submit(req)
    engine.warmup()
    sched.run()
    return list(requests)
