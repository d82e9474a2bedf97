"""The executor: an asyncio step that drains the scheduler's queue, then replays a bucket or runs eagerly."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import torch

from aiostep import EngineConfig, Request, ScheduledBatch
from attn.backend import AsyncFlashInferBackend
from attn.trtllm_decode import TrtllmDecodePath
from runtime.graph_runner import BucketGraphRunner, DecodeModel
from scheduling.scheduler import AsyncScheduler

logger = logging.getLogger(__name__)


class AsyncEngine:
    def __init__(self, cfg: EngineConfig, kv_caches: list[torch.Tensor], device: torch.device):
        self.cfg, self.device = cfg, device
        self.backend = AsyncFlashInferBackend(cfg, device)
        self.scheduler = AsyncScheduler(cfg, device, cfg.max_batch, indices_sink=self.backend.kv_indices_buf)
        self.trtllm = TrtllmDecodePath(cfg, self.backend, device)
        self.model = DecodeModel(cfg, self.backend, kv_caches)
        self.runner = BucketGraphRunner(self.model, self.backend, cfg)
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = torch.randn(cfg.vocab_size, hidden, dtype=torch.bfloat16, device=device)
        self.lm_head = torch.randn(hidden, cfg.vocab_size, dtype=torch.bfloat16, device=device)
        self.queue: asyncio.Queue[ScheduledBatch] = asyncio.Queue(maxsize=2)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aiostep-host")
        self.step_no, self.log_every, self.eos_token_id = 0, 100, 2
        self.stats: list[int] = []
        self.logits_buf: Optional[torch.Tensor] = None
        self.next_tokens_host: Optional[torch.Tensor] = None
        self._producer: Optional[asyncio.Task] = None

    async def start(self) -> None:
        assert self._producer is None, "engine already started"  # ok: FC109
        self.backend.init_graph_buffers()
        self.backend.warmup_kernels()
        self.runner.record_all()
        logger.info("workspaces: %s", self.backend.workspace_stats())
        self._producer = asyncio.get_running_loop().create_task(self.schedule_loop())

    async def generate(self, prompts: list[list[int]], first_slot: int = 0) -> None:
        assert first_slot + len(prompts) <= self.cfg.max_batch, "not enough slots"  # expect: FC109
        for i, prompt in enumerate(prompts, start=first_slot):
            first, n_pages = i * self.cfg.max_pages_per_req, -(-len(prompt) // self.cfg.page_size)
            await self.scheduler.waiting.put(Request(i, i, len(prompt), prompt[-1], list(range(first, first + n_pages))))

    async def schedule_loop(self) -> None:
        async for batch in self.scheduler.stream_batches():
            await self.queue.put(batch)

    def _page_usage(self, batch: ScheduledBatch) -> int:
        """Pages held by the batch, for the admission budget; runs on the host pool."""
        return sum(batch.kv_indptr.diff().tolist())  # expect: FC101

    def _record_stats(self, batch: ScheduledBatch) -> None:
        lens_np = batch.seq_lens_cpu.numpy()  # ok: FC101
        long_reqs = [rid for rid, n in zip(batch.req_ids, lens_np) if n > self.cfg.window_size]  # ok: FC101
        self.stats.append(batch.kv_indptr_cpu[-1].item())  # ok: FC101
        if long_reqs:
            logger.debug("%d requests past the attention window", len(long_reqs))

    async def step(self) -> list[int]:
        batch: ScheduledBatch = await self.queue.get()
        assert batch.batch_size > 0, "scheduler yielded an empty batch"  # ok: FC109
        self.step_no += 1
        self.scheduler.pages_in_use = await asyncio.get_running_loop().run_in_executor(self.pool, self._page_usage, batch)
        await asyncio.to_thread(self._record_stats, batch)
        self.seq_lens_cpu = batch.seq_lens_cpu.clone()  # ok: FC107
        logger.debug("step %d seq_lens=%s", self.step_no, batch.seq_lens)  # ok: FC101
        if self.step_no % self.log_every == 0:
            logger.info(f"step {self.step_no}: {batch.batch_size} reqs, longest {batch.seq_lens.max()}")  # expect: FC101
        q = self.embed[batch.input_ids].view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        if not batch.is_decode:
            return await self._run_extend(batch, q)
        if batch.batch_size <= self.runner.buckets[-1]:
            h = await self.runner.replay(batch, q)
        elif self.cfg.use_trtllm_decode:
            h = q
            for kv in self.model.kv_caches:
                h = self.trtllm.decode(h, kv, batch)
        else:
            await self.backend.init_forward_metadata(batch)
            h = self.model.forward_eager(q, batch.positions)
        return await self._finish_decode(batch, h)

    async def _run_extend(self, batch: ScheduledBatch, q: torch.Tensor) -> list[int]:
        await self.backend.init_forward_metadata(batch)
        h = q
        for kv in self.model.kv_caches:
            h = self.backend.forward_extend(h, kv, batch)
        # Let the prompt activations drain before the next admission reuses their blocks.
        torch.cuda.synchronize()  # expect: FC101
        return await self._finish_decode(batch, h[batch.qo_indptr[1:] - 1])

    async def _finish_decode(self, batch: ScheduledBatch, h: torch.Tensor) -> list[int]:
        n, cfg = batch.batch_size, self.cfg
        if self.logits_buf is None:
            self.logits_buf = torch.empty(cfg.max_batch, cfg.vocab_size, dtype=torch.bfloat16, device=self.device)  # ok: FC107
        next_tokens = torch.argmax(torch.matmul(h[:n].flatten(1), self.lm_head, out=self.logits_buf[:n]), dim=-1)
        if self.next_tokens_host is None or self.next_tokens_host.numel() < n:
            self.next_tokens_host = torch.empty(cfg.max_batch, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.next_tokens_host[:n].copy_(next_tokens, non_blocking=True)  # ok: FC101
        self.last_positions = batch.positions.clone()  # expect: FC107
        self.runner.static_positions[:n].add_(1)  # ok: FC104
        finished_slots = batch.slot_ids[next_tokens == self.eos_token_id]  # expect: FC101
        self.scheduler.finished[finished_slots] = True
        tokens = self.next_tokens_host[:n].tolist()  # expect: FC101
        self.release_finished(batch, [i for i, t in enumerate(tokens) if t == self.eos_token_id])
        return tokens

    def release_finished(self, batch: ScheduledBatch, done: list[int]) -> None:
        """Scrub the finished requests' pages from the page table the graphs read."""
        indptr = batch.kv_indptr_cpu
        for i in done:
            self.backend.kv_indices_buf[int(indptr[i]) : int(indptr[i + 1])].fill_(-1)  # expect: FC104

    def compact_pages(self, remap: torch.Tensor) -> None:
        self.backend.kv_indices_buf.copy_(remap[self.backend.kv_indices_buf.long()])  # expect: FC104

    async def shutdown(self) -> None:
        if self._producer is not None:
            self._producer.cancel()
        torch.cuda.synchronize()  # ok: FC101
        self.pool.shutdown(wait=True)
