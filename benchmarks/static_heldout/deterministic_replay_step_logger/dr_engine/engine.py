"""An engine that records every step for deterministic replay."""

from __future__ import annotations

import logging

import flashcheck
import torch

from dr_attn.backend import ReplayableBackend
from dr_engine.batch import ScheduleOutput, StepBatchBuilder
from dr_engine.config import EngineConfig
from dr_engine.graphs import BucketGraphs
from dr_engine.model import ReplayLM
from steplog import Checksummer, StepRecorder

logger = logging.getLogger(__name__)


class LoggedEngine:
    def __init__(self, cfg: EngineConfig, device_index: int = 0):
        self.cfg = cfg
        self.device = torch.device("cuda", device_index)
        self.backend = ReplayableBackend(cfg, self.device)
        self.kv_cache = torch.zeros(
            cfg.num_layers, cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=torch.bfloat16, device=self.device,
        )
        self.model = ReplayLM(cfg, self.backend).to(self.device)
        self.graphs = BucketGraphs(cfg, self.model, self.backend, self.kv_cache, self.device)
        self.builder = StepBatchBuilder(cfg, self.device)
        self.recorder = StepRecorder(cfg.record_capacity, cfg.max_batch)
        self.checksummer = Checksummer(cfg.vocab_size, self.device)
        self.step_idx = 0

    def start(self) -> None:
        self.graphs.capture_all()

    def forward(self, sched: ScheduleOutput):
        batch = self.builder.build(sched)
        self.backend.init_forward_metadata(batch)
        if batch.num_prefill:
            logits = self.model.prefill(batch.input_ids, batch.positions, self.kv_cache, batch.qo_indptr)
        else:
            bucket = self.graphs.bucket_for(batch.batch_size)
            if bucket is not None:
                logits = self.graphs.replay(bucket, batch)
            else:
                logits = self.model.decode(batch.input_ids, batch.positions, self.kv_cache, batch.batch_size)
        return batch, logits

    @flashcheck.hot_path
    def step(self, sched: ScheduleOutput) -> torch.Tensor:
        batch, logits = self.forward(sched)
        tokens = torch.argmax(logits, dim=-1)
        csum = self.checksummer(logits)
        logger.debug("step %d checksum %s", self.step_idx, csum)  # ok: FC101
        rec = self.recorder.record(self.step_idx, batch, tokens, self.backend.snapshot_plan_state())
        rec.checksum = float(csum)  # expect: FC101
        self.step_idx += 1
        return tokens

    def make_replayer(self):
        from dr_engine.replayer import StepReplayer

        return StepReplayer(self)
