"""asyncio engine core: a request queue, one GPU step at a time in an executor thread, streamed tokens."""
import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Dict, List, Set, Tuple

import torch

from aecore.config import EngineConfig
from aecore.request import ModelOutput, Request, Scheduler
from aecore_runtime.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class OutputProcessor:
    def __init__(self, max_num_seqs: int):
        self.queues: Dict[str, asyncio.Queue] = {}
        self.logprobs_cpu = torch.zeros(max_num_seqs, dtype=torch.float32, pin_memory=True)
        self.token_history_cpu = torch.zeros(0, dtype=torch.int64)

    def add_stream(self, request_id: str, queue: asyncio.Queue) -> None:
        assert request_id not in self.queues  # expect: FC109
        self.queues[request_id] = queue

    def process_outputs(self, output: ModelOutput, req_ids: List[str], token_ids: List[int]) -> Set[str]:
        n = output.num_reqs
        self.logprobs_cpu[:n].copy_(output.logprobs)  # expect: FC101
        lps = self.logprobs_cpu[:n].tolist()  # ok: FC101
        finished_rows = set(output.finished.nonzero().flatten().tolist())  # expect: FC101
        self.token_history_cpu = torch.cat([self.token_history_cpu, torch.tensor(token_ids)])  # ok: FC107
        for i, rid in enumerate(req_ids):
            if (queue := self.queues.get(rid)) is not None:
                queue.put_nowait((token_ids[i], lps[i]))
        return {req_ids[i] for i in finished_rows}

    def close(self, request_id: str) -> None:
        if (queue := self.queues.get(request_id)) is not None:
            queue.put_nowait(None)

    async def stream(self, request_id: str) -> AsyncIterator[Tuple[int, float]]:
        queue = self.queues[request_id]
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            self.queues.pop(request_id, None)


class EngineCore:
    def __init__(self, cfg: EngineConfig, device: str = "cuda"):
        self.input_queue: "asyncio.Queue[Request]" = asyncio.Queue()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aecore-gpu")
        self.scheduler = Scheduler(cfg, torch.device(device))
        self.model_runner = ModelRunner(cfg, torch.device(device))
        self.output_processor = OutputProcessor(cfg.max_num_seqs)
        self.sampled_cpu = torch.empty(cfg.max_num_seqs, dtype=torch.int64, pin_memory=True)
        self.stats: Dict[str, float] = {"tokens": 0, "finished": 0, "mean_logprob": 0.0}
        self._backend = "flashinfer"  # ok: FC103

    async def start(self) -> None:
        n = await asyncio.get_running_loop().run_in_executor(self.executor, self.model_runner.compile_graphs)
        logger.info("captured %d decode graphs (%s attention)", n, self._backend)
        self._task = asyncio.create_task(self.run_forever())

    async def run_forever(self) -> None:
        while True:
            if await self.step() == 0:
                await asyncio.sleep(0.002)

    async def step(self) -> int:
        assert self.executor is not None  # ok: FC109
        while not self.input_queue.empty():
            req = self.input_queue.get_nowait()
            assert isinstance(req, Request)  # ok: FC109
            self.scheduler.waiting.append(req)
        if (batch := self.scheduler.schedule()) is None:
            return 0
        loop = asyncio.get_running_loop()
        output = await loop.run_in_executor(self.executor, self.model_runner.execute_model, batch)
        n = output.num_reqs
        if self.sampled_cpu.numel() < n:
            self.sampled_cpu = torch.empty(2 * n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        torch.cuda.current_stream().wait_event(output.done_event)
        self.sampled_cpu[:n].copy_(output.sampled_token_ids, non_blocking=True)  # ok: FC101
        (copied := torch.cuda.Event()).record()
        await loop.run_in_executor(self.executor, copied.synchronize)  # ok: FC101
        token_ids: List[int] = self.sampled_cpu[:n].tolist()  # ok: FC101
        self.stats["tokens"] += int(output.sampled_token_ids.numel())  # ok: FC101
        self.stats["finished"] += sum(output.finished)  # expect: FC101
        self.stats["mean_logprob"] = float(output.logprobs.mean())  # expect: FC101
        finished = self.output_processor.process_outputs(output, batch.req_ids, token_ids)
        for rid in finished | set(self.scheduler.append_tokens(batch.req_ids, token_ids)):
            self.scheduler.finish(rid)
            self.output_processor.close(rid)
        return n

    async def generate(self, req: Request) -> AsyncIterator[Tuple[int, float]]:
        assert req.max_tokens > 0  # expect: FC109
        self.output_processor.add_stream(req.request_id, asyncio.Queue())
        await self.input_queue.put(req)
        try:
            async for item in self.output_processor.stream(req.request_id):
                yield item
        finally:  # the caller went away: abort, and scrub the request's pages from the graph page table
            if pages := self.scheduler.finish(req.request_id):
                self.model_runner.free_request(pages)
