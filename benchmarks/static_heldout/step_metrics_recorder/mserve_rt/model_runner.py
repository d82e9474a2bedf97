from __future__ import annotations

import torch

from mserve.attn import FlashInferBackend
from mserve.config import EngineConfig
from mserve.forward_batch import ForwardBatch, ForwardMode
from mserve.kv_pool import PagedKVPool
from mserve.metrics import MetricsRegistry, StepMetrics
from mserve.recorder import StepHooks, StepRecorder

from .cuda_graph_runner import CudaGraphRunner
from .model import Decoder


class ModelRunner:
    def __init__(self, cfg: EngineConfig, device: str = "cuda", use_graphs: bool = True):
        self.cfg = cfg
        self.device = torch.device(device)
        self.registry = MetricsRegistry()
        self.metrics = StepMetrics(self.registry, cfg.max_running_requests, self.device)
        self.recorder = StepRecorder(cfg.record_dir, cfg.record_every, cfg.max_running_requests, self.device)
        self.hooks = StepHooks(self.metrics, self.recorder)
        self.pool = PagedKVPool(cfg, self.device)
        self.attn_backend = FlashInferBackend(cfg, self.pool, self.hooks, self.device)
        self.model = Decoder(cfg, self.attn_backend).to(self.device)
        self.graph_runner = CudaGraphRunner(self) if use_graphs else None

    def forward(self, fb: ForwardBatch, last_rows: torch.Tensor) -> torch.Tensor:
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        if fb.forward_mode == ForwardMode.DECODE:
            return self.model.forward_decode(fb)
        return self.model.forward_extend(fb, last_rows)
