"""The runner: ``step`` folds the step context over the stages of ``opserve.stages``."""

from __future__ import annotations

import functools
import logging
import operator
import queue
import threading
from typing import Callable, List, Optional, Tuple

import torch

from opserve.attention.backend import FlashInferPipelineBackend
from opserve.attention.planner import pages_per_request
from opserve.batch import StepBatch, mode_and_size, seq_lens_cpu_of, seq_lens_of
from opserve.config import EngineConfig
from opserve.graph_runner import CudaGraphRunner
from opserve.kv_pool import PagedKVPool
from opserve.layers import PipelineModel, layer_bmm_scales
from opserve.sampler import Sampler
from opserve.stages import OVERLAP_STEP_STAGES, STEP_STAGES, StepContext, run_stage
from opserve_tools import memory_report
from opserve_tools.kv_compactor import KVCompactor

logger = logging.getLogger(__name__)

TokenSink = Callable[[str, int], None]


class ModelRunner:
    def __init__(self, config: EngineConfig, device: torch.device, emit: TokenSink):
        self.config = config
        self.device = device
        self.emit = emit
        self.kv_pool = PagedKVPool(config, config.max_total_pages(), device)
        self.attn_backend = FlashInferPipelineBackend(config, self.kv_pool, device)
        self.model = PipelineModel(config, self.attn_backend, device)
        self.sampler = Sampler(config, device)
        self.compactor = KVCompactor(self.kv_pool.num_pages, device)
        self.kv_stream = torch.cuda.Stream(device)
        self.next_ids_host = torch.zeros(config.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.output_queue: "queue.Queue[Tuple[List[str], torch.Tensor, torch.cuda.Event]]" = queue.Queue()
        self.graph_runner: Optional[CudaGraphRunner] = None
        self._stages = OVERLAP_STEP_STAGES if config.overlap_kv_stream else STEP_STAGES
        threading.Thread(target=self._drain_outputs, name="token-sink", daemon=True).start()

    # ------------------------------------------------------------------ start-up

    def warmup(self) -> None:
        self._profile_memory()
        if self.config.use_cuda_graph:
            self.graph_runner = CudaGraphRunner(self)
            self.graph_runner.capture()
        logger.info("attention memory: %s", memory_report.report(self))

    def _profile_memory(self) -> None:
        free, total = torch.cuda.mem_get_info(self.device)
        used_pages = (~self.kv_pool.free_pages).sum().item()  # ok: FC101
        logger.info("free %d MiB of %d MiB, %d KV pages in use", free >> 20, total >> 20, used_pages)

    def layer_scales(self) -> List[Tuple[float, float]]:
        return list(map(functools.partial(layer_bmm_scales, q_scale=self.config.q_scale), self.model.layers))

    # ------------------------------------------------------------------ the step

    def step(self, batch: StepBatch) -> StepContext:
        ctx = StepContext(runner=self, batch=batch)
        return functools.reduce(run_stage, self._stages, ctx)

    def prepare_inputs(self, ctx: StepContext) -> None:
        mode, bs = mode_and_size(ctx.batch)
        if bs > self.config.max_batch_size:
            raise ValueError(f"{mode.name} batch of {bs} exceeds max_batch_size={self.config.max_batch_size}")
        if int(seq_lens_cpu_of(ctx.batch).max()) > self.config.max_context_len:  # ok: FC101
            raise ValueError(f"a request exceeds max_context_len={self.config.max_context_len}")
        ctx.num_kv_pages = int(pages_per_request(seq_lens_cpu_of(ctx.batch), self.config.page_size).sum())
        runner = self.graph_runner
        ctx.graph_bs = runner.bucket_for(bs) if runner is not None and runner.can_run(ctx.batch) else None

    def select_attention_path(self, ctx: StepContext) -> None:
        batch = ctx.batch
        if self.attn_backend.use_trtllm_decode and batch.is_decode:
            ctx.max_seq_len = int(seq_lens_of(batch).max())  # expect: FC101
            ctx.bmm_scales = self.layer_scales()
        if ctx.graph_bs is None:
            self.attn_backend.init_forward_metadata(batch)

    def forward(self, ctx: StepContext) -> None:
        if ctx.graph_bs is not None:
            self.graph_runner.replay(ctx)
        else:
            ctx.logits = self.model(ctx)

    def compact_kv(self, ctx: StepContext) -> None:
        """Apply a pending page compaction on kv_stream: move pages, then renumber every page list."""
        moves = self.compactor.pop_moves()
        if moves is None:
            return
        with torch.cuda.stream(self.kv_stream):
            self.kv_stream.wait_stream(torch.cuda.current_stream())
            self.compactor.move_pages(self.kv_pool, moves)
            table = self.kv_pool.req_to_page
            table.copy_(moves.remap[table.long()])  # ok: FC104
            live = self.attn_backend.kv_indices[: ctx.num_kv_pages]
            live.copy_(moves.remap[live.long()])  # expect: FC104

    def advance_pages(self, ctx: StepContext) -> None:
        """Decode appends one token per row: roll the last-page lengths forward on the device."""
        if not ctx.batch.is_decode:
            return
        last = operator.attrgetter("kv_last_page_len")(self.attn_backend)[: ctx.batch.batch_size]
        last.copy_(last % self.config.page_size + 1)  # expect: FC104

    def finish_step(self, ctx: StepContext) -> None:
        bs = ctx.batch.batch_size
        host_ids = self.next_ids_host[:bs]
        host_ids.copy_(ctx.next_ids, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.output_queue.put((ctx.batch.request_ids, host_ids, done))

    # ------------------------------------------------------------------ output thread

    def _drain_outputs(self) -> None:
        while True:
            rids, host_ids, done = self.output_queue.get()
            done.synchronize()
            for rid, token in zip(rids, host_ids.tolist()):  # ok: FC101
                self.emit(rid, token)
