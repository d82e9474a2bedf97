"""An engine with per-step tracing hooks around decode graphs and a paged prefill."""
from __future__ import annotations

from typing import List

import numpy as np
import torch

import flashcheck
from tracing import SamplingProfiler, TensorStatsCollector, due_hooks, nvtx_range, register_hook
from tr_attn.backend import PrefillBatch, TracedAttnBackend
from tr_attn.config import TraceEngineConfig
from tr_run.debug_hooks import PoisonHook, StepCounterHook
from tr_run.graphs import DecodeBatch, TracedGraphRunner
from tr_run.model import TracedLM

KERNELS = ("decode_attn", "prefill_attn")


class TracedEngine:
    def __init__(self, cfg: TraceEngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.profiler = SamplingProfiler(cfg.profile_every_n, KERNELS, device)
        self.stats = TensorStatsCollector(cfg.max_stat_slots, cfg.stats_flush_every, device)
        self.backend = TracedAttnBackend(cfg, device, self.profiler)
        kv_caches = [
            torch.zeros(cfg.max_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim,
                        dtype=torch.float16, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.model = TracedLM(cfg, self.backend, kv_caches)
        self.runner = TracedGraphRunner(cfg, self.backend, self.model, device)
        self.counter = StepCounterHook()
        register_hook("counter", self.counter)
        if cfg.poison_unused_pages:
            register_hook("poison", PoisonHook(self.backend), every_n=cfg.poison_every)
        self.step_idx = 0

    def warmup(self) -> None:
        self.runner.capture_all()

    def make_prefill_batch(self, token_ids: List[List[int]], pages: List[List[int]]) -> PrefillBatch:
        lens = np.array([len(t) for t in token_ids], dtype=np.int32)
        npages = np.array([len(p) for p in pages], dtype=np.int32)
        qo_indptr_cpu = torch.from_numpy(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
        return PrefillBatch(
            input_ids=torch.tensor([t for ts in token_ids for t in ts], dtype=torch.int64).to(self.device),
            positions=torch.tensor([i for n in lens for i in range(n)], dtype=torch.int64).to(self.device),
            # the KV-append kernel reads qo_indptr on the device
            qo_indptr_gpu=qo_indptr_cpu.to(self.device, non_blocking=True),
            kv_indptr_cpu=torch.from_numpy(np.concatenate([[0], np.cumsum(npages)]).astype(np.int32)),
            kv_indices=torch.tensor([p for ps in pages for p in ps], dtype=torch.int32).to(self.device),
            last_page_cpu=torch.from_numpy(((lens - 1) % self.cfg.page_size + 1).astype(np.int32)),
            num_tokens=int(lens.sum()),
        )

    def prefill(self, batch: PrefillBatch) -> torch.Tensor:
        with nvtx_range(f"prefill tokens={batch.num_tokens}"):
            self.backend.plan_prefill(batch)
            return self.model.forward_prefill(batch.input_ids, batch.positions)

    @flashcheck.hot_path
    def step(self, batch: DecodeBatch) -> torch.Tensor:
        bs = batch.batch_size
        self.profiler.begin(self.step_idx)
        with nvtx_range(f"step {self.step_idx} bs={bs}"):  # ok: FC101
            if bs <= self.cfg.largest_bucket:
                logits = self.runner.replay(batch)
            elif batch.max_seq_len > self.cfg.max_pages_per_seq * self.cfg.page_size // 2:
                logits = self.model.forward_long(batch.input_ids, batch.seq_lens, batch.max_seq_len)
            else:
                self.backend.plan_eager(batch.kv_indptr_cpu, batch.kv_indices, batch.last_page_cpu)
                logits = self.model.forward_decode(batch.input_ids, batch.positions)
        self.stats.observe("logits", logits)
        self.stats.on_step(self.step_idx)
        self.profiler.on_step(self.step_idx)
        for hook in due_hooks(self.step_idx):
            hook.after_step(self.step_idx)
        self.step_idx += 1
        return logits
