"""The asyncio loop: step N runs on the GPU while step N+1's metadata is built on a thread."""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import torch
from flashcheck import hot_path

from asyncserve.config import AsyncEngineConfig
from asyncserve.protocol import StepResult
from asyncserve.sched.meta_builder import HostMetaBuilder
from asyncserve.sched.scheduler import AsyncScheduler
from gpu.worker import GpuWorker


class AsyncEngine:
    def __init__(self, cfg: AsyncEngineConfig, device: str = "cuda"):
        self.cfg = cfg
        self.scheduler = AsyncScheduler(cfg)
        self.builder = HostMetaBuilder(cfg)
        self.worker = GpuWorker(cfg, torch.device(device))
        self.meta_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="step-meta")
        self.sync_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="copy-wait")
        self.pending_meta: Optional[asyncio.Future] = None
        self.in_flight: Optional[StepResult] = None
        self.results: asyncio.Queue = asyncio.Queue()
        self._stop = asyncio.Event()

    async def _collect(self, prev: StepResult):
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.sync_pool, prev.copy_done.synchronize)
        tokens = prev.tokens_pinned.tolist()  # ok: FC101
        self.scheduler.commit(prev.req_ids, tokens)
        await self.results.put((prev.step_id, prev.req_ids, tokens))

    def _kick_build(self, loop, after: Optional[StepResult]):
        sched = self.scheduler.schedule()
        if sched is None:
            self.pending_meta = None
            return
        self.pending_meta = loop.run_in_executor(self.meta_pool, self.builder.build, sched, after)

    @hot_path
    async def run_step(self) -> bool:
        loop = asyncio.get_running_loop()
        if self.pending_meta is None:
            self._kick_build(loop, self.in_flight)
            if self.pending_meta is None:
                return False
        meta = await self.pending_meta
        prev = self.in_flight
        result = self.worker.execute_step(meta, prev)
        # while the GPU runs this step: collect the previous one, then build the next one
        if prev is not None:
            await self._collect(prev)
        self._kick_build(loop, result)
        if result.finished.any():  # expect: FC101
            self.scheduler.wakeup.set()
        self.in_flight = result
        return True

    async def serve_forever(self):
        while not self._stop.is_set():
            if not await self.run_step():
                self.scheduler.wakeup.clear()
                await self.scheduler.wakeup.wait()

    def stop(self):
        self._stop.set()
        self.scheduler.close()
