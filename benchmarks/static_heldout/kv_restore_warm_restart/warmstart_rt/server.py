from __future__ import annotations

import signal

import torch

from warmstart.config import RestartConfig
from warmstart.snapshot.writer import SnapshotWriter
from warmstart_rt.model_runner import ModelRunner
from warmstart_rt.restore import WarmRestartCoordinator
from warmstart_rt.scheduler import Scheduler


class WarmStartServer:
    def __init__(self, cfg: RestartConfig):
        self.cfg = cfg
        self.runner = ModelRunner(cfg)
        self.scheduler = Scheduler(cfg, self.runner.kv_pool, self.runner.req_to_page, self.runner.device)
        self.writer = SnapshotWriter(cfg.snapshot_dir)
        self.coordinator = WarmRestartCoordinator(self.runner, self.scheduler, cfg.snapshot_dir)
        self._stop = False

    def _on_sigterm(self, signum, frame) -> None:
        self._stop = True

    def serve(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        if not self.coordinator.restore():
            self.runner.graph_runner.capture()
        while not self._stop:
            fb = self.scheduler.next_decode_batch()
            if fb is None:
                continue
            logits = self.runner.forward(fb)
            self.scheduler.process_decode(torch.argmax(logits[: fb.batch_size], dim=-1))
        self.writer.persist(self.runner, self.scheduler)
