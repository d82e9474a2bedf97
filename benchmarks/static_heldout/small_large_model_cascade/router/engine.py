"""Engine: builds both tiers, captures their graphs, runs the router and streams tokens from a thread."""

from __future__ import annotations

import logging
import queue
import threading
from typing import List

import torch

from cascade.config import CascadeConfig
from cascade.requests import Request
from cascade.scoring import DifficultyScorer
from router.cascade_router import CascadeRouter
from router.migrate import PrefixMigrator
from tiers.runtime import TierRuntime

logger = logging.getLogger(__name__)


class OutputStreamer(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.q: "queue.Queue" = queue.Queue()

    def push(self, reqs: List[Request], next_ids: torch.Tensor) -> None:
        host = torch.empty(next_ids.shape, dtype=next_ids.dtype, pin_memory=True)
        host.copy_(next_ids, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.q.put((reqs, host, done))

    def run(self) -> None:
        while True:
            reqs, host, done = self.q.get()
            done.synchronize()  # ok: FC101
            for r, tok in zip(reqs, host.tolist()):
                r.output_ids.append(tok)


class CascadeEngine:
    def __init__(self, cfg: CascadeConfig, device: torch.device):
        self.cfg = cfg
        shared_int_workspace = torch.zeros(cfg.int_workspace_bytes, dtype=torch.uint8, device=device)
        large_backend = "trtllm-gen" if torch.cuda.get_device_capability(device)[0] >= 10 else "fa2"
        self.small = TierRuntime(cfg.small, device, "fa2", shared_int_workspace, cfg.max_requests)
        self.large = TierRuntime(cfg.large, device, large_backend, shared_int_workspace, cfg.max_requests)
        token_hist = torch.zeros(cfg.max_requests, cfg.max_context_len, dtype=torch.int64, device=device)
        self.scorer = DifficultyScorer(cfg.small.max_batch, cfg.escalate_entropy, device)
        self.migrator = PrefixMigrator(self.small, self.large, token_hist, device)
        self.router = CascadeRouter(self.small, self.large, self.scorer, self.migrator, token_hist, device)
        self.streamer = OutputStreamer()
        for tier in (self.small, self.large):
            tier.graphs.capture_all()
            logger.info("tier %s: decode backend %s", tier.spec.name, tier.attn._backend)  # ok: FC103
        self.streamer.start()

    def serve(self, running: List[Request]) -> None:
        while running:
            for reqs, next_ids in self.router.step(running).values():
                self.streamer.push(reqs, next_ids)
            running = [r for r in running if len(r.output_ids) < 256]
