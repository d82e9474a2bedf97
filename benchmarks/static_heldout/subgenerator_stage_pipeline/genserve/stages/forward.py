"""Run the forward (graph replay or eager) and pick the next tokens."""

from __future__ import annotations

from typing import Generator, Optional

import torch

from ..batch import StageEvent, StepMeta
from ..config import EngineConfig
from ..graphs import GraphRunner
from ..model import TinyDecoder


class ModelStage:
    def __init__(self, cfg: EngineConfig, model: TinyDecoder, graphs: GraphRunner) -> None:
        self.cfg = cfg
        self.model = model
        self.graphs = graphs
        self.device = torch.device(cfg.device)
        self.sample_out: Optional[torch.Tensor] = None

    def run_model(self, meta: StepMeta) -> Generator[StageEvent, None, torch.Tensor]:
        if meta.bucket is not None:
            logits = self.graphs.replay(meta.batch_size, meta)
        elif meta.is_prefill:
            logits = self.model.prefill_forward(meta.input_ids, meta.positions, meta)
        else:
            logits = self.model.decode_forward(meta.input_ids, meta.positions, meta)
        # the driver may overlap host work with the forward in flight
        yield StageEvent("forward", meta.batch_size)
        if self.sample_out is None:
            self.sample_out = torch.empty(self.cfg.max_batch_size, dtype=torch.int64, device=self.device)  # ok: FC107
        next_tokens = self.sample_out[: meta.batch_size]
        torch.argmax(logits, dim=-1, out=next_tokens)
        return next_tokens
