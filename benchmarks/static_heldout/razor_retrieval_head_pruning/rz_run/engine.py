"""The serving loop: route, plan both families, replay or run eagerly, sample."""

from typing import List

import numpy as np
import torch

from razor import HeadRouter, HeadScores, RazorBatch, RazorConfig
from rz_attn.backend import RazorBackend
from rz_run.graphs import RazorGraphPool
from rz_run.model import RazorLM


class SlotTable:
    """Host view of the compressed-pool slots each request owns (sink pages, then the window ring)."""

    def __init__(self, cfg: RazorConfig):
        self.cfg = cfg
        self.evicted_pages = 0

    def roll(self, rows: np.ndarray) -> None:
        # the ring slot reused by each of these rows drops its oldest window page
        self.evicted_pages += int(rows.size)


class RazorEngine:
    def __init__(self, cfg: RazorConfig, scores_path: str, device: torch.device):
        self.cfg = cfg
        self.router = HeadRouter(cfg, HeadScores.load(scores_path), device)
        self.backend = RazorBackend(cfg, device)
        self.model = RazorLM(cfg, self.backend, self.router).to(device)
        self.graphs = RazorGraphPool(cfg, self.model, self.backend, device)
        self.slots = SlotTable(cfg)
        self.token_staging = torch.zeros(cfg.max_batch_size, dtype=torch.long, pin_memory=True)

    def start(self) -> None:
        self.backend.check_layouts()
        self.graphs.record_all()

    def step(self, batch: RazorBatch) -> List[int]:
        n = batch.batch_size
        bs = self.graphs.bucket_for(n)
        if bs is None:
            self.backend.plan_step(batch)
            logits = self.model(batch.input_ids, batch.positions, None)
        else:
            logits = self.graphs.replay(bs, batch)
        if not torch.isfinite(logits[:n]).all():  # expect: FC101
            raise FloatingPointError("non-finite logits")
        rolled = batch.seq_lens_cpu[:n] % self.cfg.page_size == 0
        if rolled.any():  # ok: FC101
            self.slots.roll(np.flatnonzero(rolled))
        # pure decode: next step's compressed last-page lengths are these plus one, wrapping at a page
        lens = self.backend.comp_last_len[:n]
        lens.copy_(lens % self.cfg.page_size + 1)  # expect: FC104
        self.token_staging[:n].copy_(logits[:n].argmax(-1), non_blocking=True)
        return self.token_staging[:n].tolist()  # expect: FC101
