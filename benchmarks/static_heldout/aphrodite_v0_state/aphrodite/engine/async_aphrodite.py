"""Async front end: a background engine-loop task, output handlers run in a thread pool."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional

import torch

logger = logging.getLogger(__name__)


class AsyncAphrodite:
    def __init__(self, engine, max_num_seqs: int):
        self.engine = engine
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="aphrodite-out")
        self._handlers: Dict[str, Callable] = {"tokens": self._emit_tokens, "logprobs": self._emit_logprobs}
        self._copy_stream = torch.cuda.Stream()
        self._logprobs_host = torch.empty(max_num_seqs, dtype=torch.float32, pin_memory=True)
        self._task: Optional[asyncio.Task] = None
        self._streams: Dict[str, asyncio.Queue] = {}

    def start_background_loop(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run_engine_loop())
        self._task.add_done_callback(lambda t: logger.error("engine loop stopped: %s", t.exception()))

    async def run_engine_loop(self) -> None:
        while True:
            if not await self.engine_step():
                await asyncio.sleep(0.005)

    async def engine_step(self) -> bool:
        seq_groups = self.engine.scheduler.schedule()
        if not seq_groups:
            return False
        runner = self.engine.model_executor.driver_worker.model_runner
        model_input = runner.prepare_model_input(seq_groups)
        out = runner.execute_model(model_input, self.engine.kv_caches)
        token_ids = out.sampled_token_ids.tolist()  # expect: FC101
        n = len(token_ids)
        with torch.cuda.stream(self._copy_stream):
            self._copy_stream.wait_stream(torch.cuda.current_stream())
            self._logprobs_host[:n].copy_(out.logprobs.view(-1), non_blocking=True)  # ok: FC101
            done = torch.cuda.Event()
            done.record()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, done.synchronize)  # ok: FC101
        logprobs = self._logprobs_host[:n].tolist()  # ok: FC101
        loop.run_in_executor(self._pool, self._handlers["tokens"], seq_groups, token_ids)
        loop.run_in_executor(self._pool, self._handlers["logprobs"], seq_groups, logprobs)
        return True

    def _emit_tokens(self, seq_groups: list, token_ids: List[int]) -> None:
        for sg, tok in zip(seq_groups, token_ids):
            q = self._streams.get(sg.request_id)
            if q is not None:
                q.put_nowait(("token", tok))

    def _emit_logprobs(self, seq_groups: list, logprobs: List[float]) -> None:
        for sg, lp in zip(seq_groups, logprobs):
            q = self._streams.get(sg.request_id)
            if q is not None:
                q.put_nowait(("logprob", lp))
