"""Step stages: small functions run in order over a StepContext by ``functools.reduce``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

import torch

from opserve.batch import StepBatch

if TYPE_CHECKING:
    from opserve.model_runner import ModelRunner


@dataclasses.dataclass
class StepContext:
    """Everything one step produces, filled stage by stage. Built anew every step."""

    runner: "ModelRunner"
    batch: StepBatch
    graph_bs: Optional[int] = None
    num_kv_pages: int = 0
    max_seq_len: int = 0
    bmm_scales: List[Tuple[float, float]] = dataclasses.field(default_factory=list)
    logits: Optional[torch.Tensor] = None
    next_ids: Optional[torch.Tensor] = None
    finished_rows: Optional[torch.Tensor] = None


Stage = Callable[[StepContext], object]


def run_stage(ctx: StepContext, stage: Stage) -> StepContext:
    """Reducer for ``functools.reduce``: a stage works on the context in place."""
    stage(ctx)
    return ctx


STEP_STAGES: Tuple[Stage, ...] = (
    lambda ctx: ctx.runner.prepare_inputs(ctx),
    # The previous step's page compaction copies on kv_stream; the forward must not read a page mid-move.
    lambda ctx: ctx.runner.kv_stream.synchronize(),  # expect: FC101
    lambda ctx: ctx.runner.select_attention_path(ctx),
    lambda ctx: ctx.runner.forward(ctx),
    lambda ctx: ctx.runner.sampler.sample(ctx),
    lambda ctx: ctx.runner.compact_kv(ctx),
    lambda ctx: ctx.runner.advance_pages(ctx),
    lambda ctx: ctx.runner.finish_step(ctx),
)

# The same step for --overlap-kv-stream: the compute stream waits for kv_stream on the device.
OVERLAP_STEP_STAGES: Tuple[Stage, ...] = (
    lambda ctx: ctx.runner.prepare_inputs(ctx),
    lambda ctx: torch.cuda.current_stream().wait_stream(ctx.runner.kv_stream),  # ok: FC101
    lambda ctx: ctx.runner.select_attention_path(ctx),
    lambda ctx: ctx.runner.forward(ctx),
    lambda ctx: ctx.runner.sampler.sample(ctx),
    lambda ctx: ctx.runner.compact_kv(ctx),
    lambda ctx: ctx.runner.advance_pages(ctx),
    lambda ctx: ctx.runner.finish_step(ctx),
)

# Brackets a step in benchmarks/bench_plan.py, which times it on a drained device.
PROFILE_STAGES: Tuple[Stage, ...] = (lambda ctx: torch.cuda.synchronize(),)  # ok: FC101
