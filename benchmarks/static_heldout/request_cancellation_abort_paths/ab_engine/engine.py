from __future__ import annotations

import numpy as np
import torch

from abortable import AbortMetrics, AbortRegistry, DecodeBatch, EngineConfig
from ab_attn.backend import AbortAwareBackend
from ab_engine.graph_runner import DecodeGraphRunner
from ab_engine.model import AbortableDecoder
from ab_engine.output import OutputProcessor
from ab_engine.pages import PagePool
from ab_engine.reaper import Reaper

NO_ROWS = np.zeros(0, dtype=np.int64)


class AbortEngine:
    def __init__(self, cfg: EngineConfig, device: str = "cuda"):
        self.cfg, self.device = cfg, torch.device(device)
        kv_cache = torch.zeros(cfg.num_layers, cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim,
                               dtype=torch.bfloat16, device=self.device)
        self.registry = AbortRegistry(cfg.max_running_requests)
        self.pool = PagePool(cfg.num_pages)
        self.metrics = AbortMetrics()
        self.backend = AbortAwareBackend(cfg, kv_cache, self.device)
        self.model = AbortableDecoder(cfg, self.backend).to(self.device)
        self.runner = DecodeGraphRunner(self.model, self.backend, cfg, self.device)
        self.reaper = Reaper(self.registry, self.pool, self.backend, self.metrics, grace_steps=1)
        self.outputs = OutputProcessor(cfg.max_running_requests)
        self.copy_event = torch.cuda.Event()
        self.step_idx = 0
        self.runner.record_all()

    def abort(self, request_id: str) -> bool:
        """API thread entry point; the step notices the flag at its next boundary."""
        return self.registry.abort(request_id)

    def _dead_rows(self, bs: int) -> np.ndarray:
        flags = self.registry.flags_np[:bs]
        if not flags.any():
            return NO_ROWS
        dead = np.flatnonzero(flags).astype(np.int64)
        dead_t = torch.from_numpy(dead).to(self.device, non_blocking=True)
        self.backend.live_mask[dead_t] = False  # ok: FC104
        return dead

    def step(self, batch: DecodeBatch) -> torch.Tensor:
        bs = batch.batch_size
        dead = self._dead_rows(bs)
        if batch.is_decode and bs <= self.runner.buckets[-1]:
            logits = self.runner.replay(batch, dead)
        elif batch.is_decode:
            self.backend.init_forward_metadata(batch, dead)
            logits = self.model.forward_decode(batch.input_ids, batch.out_loc, bs)
        else:
            self.backend.init_forward_metadata(batch, dead)
            logits = self.model.forward_extend(batch.input_ids, batch.out_loc)
        next_tokens = logits.argmax(-1)
        live = self.backend.live_mask[:bs]
        finished = (next_tokens == self.cfg.eos_token_id) & live
        self.metrics.on_step((~live).sum())
        buf = self.step_idx % 2
        self.outputs.tokens_cpu[buf][:bs].copy_(next_tokens, non_blocking=True)  # ok: FC101
        self.copy_event.record()
        self.outputs.push(batch.request_ids, bs, buf, self.copy_event)
        self.reaper.reap(batch.request_ids, finished, batch.page_lists)
        self.step_idx += 1
        return next_tokens
