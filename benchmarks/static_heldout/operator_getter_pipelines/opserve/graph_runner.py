"""Captures one CUDA graph per decode bucket and replays the smallest bucket that fits."""

from __future__ import annotations

import functools
import logging
import operator
from typing import TYPE_CHECKING, Dict, Optional, Tuple

import torch

from opserve.batch import (
    SLOT_INPUTS,
    STATIC_INPUTS,
    ForwardMode,
    StepBatch,
    mode_and_size,
    seq_lens_cpu_of,
    seq_lens_of,
    slot_inputs_of,
    static_inputs_of,
)
from opserve.config import capture_sizes
from opserve.stages import StepContext

if TYPE_CHECKING:
    from opserve.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        cfg = model_runner.config
        self.device = model_runner.device
        self.capture_bs: Tuple[int, ...] = capture_sizes(cfg.max_batch_size)
        self.max_bs = self.capture_bs[-1]
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool: Optional[Tuple[int, int]] = None
        i64 = dict(dtype=torch.int64, device=self.device)
        # Graph inputs: the captured forward reads these addresses on every replay.
        self.input_ids = torch.zeros(self.max_bs, **i64)
        self.positions = torch.zeros(self.max_bs, **i64)
        self.req_pool_indices = torch.zeros(self.max_bs, **i64)
        self.out_cache_loc = torch.zeros(self.max_bs, **i64)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_page_ids = torch.zeros(self.max_bs, dtype=torch.int32, device=self.device)
        self.temperatures = torch.ones(self.max_bs, dtype=torch.float32, device=self.device)

    def can_run(self, batch: StepBatch) -> bool:
        mode, bs = mode_and_size(batch)
        return mode == ForwardMode.DECODE and bs <= self.max_bs

    def bucket_for(self, raw_bs: int) -> int:
        return next(filter(functools.partial(operator.le, raw_bs), self.capture_bs))

    # ------------------------------------------------------------------ capture

    def capture(self) -> None:
        self.model_runner.attn_backend.init_cuda_graph_state(self.max_bs)
        stream = torch.cuda.Stream(self.device)
        # Largest first, so the smaller graphs reuse the pool's blocks.
        list(map(functools.partial(self.record_bucket, stream=stream), reversed(self.capture_bs)))
        logger.info("captured %d decode graphs", len(self.graphs))

    def record_bucket(self, bs: int, *, stream: torch.cuda.Stream) -> None:
        ctx = self._capture_context(bs)
        self.model_runner.attn_backend.init_forward_metadata_capture_cuda_graph(bs, ctx.batch)
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._run_once(ctx)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=stream):
            out = self._run_once(ctx)
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def _capture_context(self, bs: int) -> StepContext:
        batch = StepBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            request_ids=[""] * bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            kv_page_ids=self.kv_page_ids[:bs],
            temperatures=self.temperatures[:bs],
        )
        runner = self.model_runner
        return StepContext(
            runner=runner,
            batch=batch,
            graph_bs=bs,
            max_seq_len=runner.config.max_context_len,
            bmm_scales=runner.layer_scales(),
        )

    def _run_once(self, ctx: StepContext) -> torch.Tensor:
        # Padded rows carry seq_len 1; a zero-length row would make the split-k merge divide by zero.
        if (seq_lens_of(ctx.batch) == 0).any():  # expect: FC101
            raise RuntimeError(f"capture batch of {ctx.batch.batch_size} has an empty row")
        return self.model_runner.model.forward_decode(ctx)

    # ------------------------------------------------------------------ replay

    def replay_prepare(self, batch: StepBatch) -> int:
        raw_bs = batch.batch_size
        if raw_bs > self.max_bs:
            raise ValueError(f"batch of {raw_bs} exceeds the largest graph ({self.max_bs}): {seq_lens_of(batch)}")  # ok: FC101
        bs = self.bucket_for(raw_bs)
        logger.debug("replay_prepare raw_bs=%d bucket=%d seq_lens=%s", raw_bs, bs, seq_lens_of(batch))  # ok: FC101
        for name, value in zip(STATIC_INPUTS, static_inputs_of(batch)):
            getattr(self, name)[:raw_bs].copy_(value, non_blocking=True)  # ok: FC107
        for name, value in zip(SLOT_INPUTS, slot_inputs_of(batch)):
            setattr(self, name, value.clone())  # expect: FC107
        self.seq_lens = torch.cat([seq_lens_of(batch), self.seq_lens.new_ones(bs - raw_bs)])  # expect: FC107
        self.seq_lens_cpu[:raw_bs].copy_(seq_lens_cpu_of(batch))
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        return bs

    def replay(self, ctx: StepContext) -> None:
        assert self.graphs, "capture() must run before replay()"  # ok: FC109
        bs = self.replay_prepare(ctx.batch)
        logger.debug(f"graph replay bucket={bs} raw_bs={ctx.batch.batch_size} seq_lens={seq_lens_of(ctx.batch)}")  # expect: FC101
        operator.itemgetter(bs)(self.graphs).replay()
        ctx.logits = operator.itemgetter(bs)(self.outputs)[: ctx.batch.batch_size]
