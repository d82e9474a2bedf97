"""The step: one generator that delegates to the stage sub-generators."""

from __future__ import annotations

from typing import Any, Generator, List

import torch

from .attention import AttentionBackend
from .batch import Request, StageEvent, StepOutput
from .buffers import StepBuffers
from .config import EngineConfig
from .graphs import GraphRunner
from .model import TinyDecoder
from .stages import MetadataStage, ModelStage, PlanStage, ScheduleStage


class StagePipeline:
    def __init__(
        self,
        cfg: EngineConfig,
        backend: AttentionBackend,
        model: TinyDecoder,
        graphs: GraphRunner,
        bufs: StepBuffers,
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.scheduler = ScheduleStage(cfg, self.device)
        self.metadata = MetadataStage(cfg, backend, bufs)
        self.planner = PlanStage(cfg, backend)
        self.runner = ModelStage(cfg, model, graphs)

    def step(self, active: List[Request]) -> Generator[StageEvent, Any, StepOutput]:
        if not active:
            return StepOutput.empty(self.device)
        batch = yield from self.scheduler.schedule(active)
        meta = yield from self.metadata.prepare_metadata(batch)
        yield from self.planner.plan_attention(meta)
        next_tokens = yield from self.runner.run_model(meta)
        return StepOutput(requests=batch.requests, next_tokens=next_tokens)
