"""The metered decode engine: SLO gauges per step, autoscaled graph buckets."""

from dataclasses import dataclass
from typing import List

import flashcheck
import torch

from slo import BucketAutoscaler, MetricsRegistry, SLOConfig, StepTimer
from slo_attn.backend import MeteredBackend
from slo_attn.batch import DecodeBatch

from .exporter import MetricsExporter
from .graph_pool import GraphPool
from .model import DecodeModel


@dataclass
class Running:
    rid: int
    tokens: List[int]
    pages: List[int]
    finished: bool = False


class MeteredEngine:
    def __init__(self, cfg: SLOConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.registry = MetricsRegistry()
        self.timer = StepTimer()
        self.backend = MeteredBackend(cfg, self.device)
        self.model = DecodeModel(cfg, self.backend).to(self.device)
        self.pool = GraphPool(self.model, self.backend, cfg, self.timer)
        self.autoscaler = BucketAutoscaler(cfg, self.pool, self.registry)
        self.exporter = MetricsExporter(self.registry, self.backend)
        self.waiting: List[int] = []
        self.tokens_total = self.registry.counter("generated_tokens_total")
        self.queue_depth = self.registry.gauge("queue_depth")
        self.active_rows = self.registry.gauge("active_rows")
        self.tpot_hist = self.registry.histogram("tpot_ms", (5, 10, 20, 30, 40, 60, 80, 120, 200))

    def start(self) -> None:
        self.backend.init_cuda_graph_state(self.pool.buckets)
        self.pool.capture_all()
        self.exporter.start()

    def make_batch(self, reqs: List[Running]) -> DecodeBatch:
        page = self.cfg.page_size
        lens_cpu = torch.tensor([len(r.tokens) for r in reqs], dtype=torch.int32)
        counts_cpu = (lens_cpu + page - 1) // page
        indptr_cpu = torch.zeros(len(reqs) + 1, dtype=torch.int32)
        indptr_cpu[1:] = torch.cumsum(counts_cpu, 0)
        indices_cpu = torch.tensor([p for r in reqs for p in r.pages], dtype=torch.int32)
        out_loc_cpu = torch.tensor([r.pages[-1] * page + (len(r.tokens) - 1) % page for r in reqs], dtype=torch.int64)
        dev = self.device
        return DecodeBatch(
            req_ids=[r.rid for r in reqs],
            input_ids=torch.tensor([r.tokens[-1] for r in reqs]).to(dev, non_blocking=True),
            out_loc=out_loc_cpu.to(dev, non_blocking=True),
            seq_lens=lens_cpu.to(dev, non_blocking=True),
            seq_lens_cpu=lens_cpu,
            page_counts=counts_cpu.to(dev, non_blocking=True),
            kv_indptr_cpu=indptr_cpu,
            kv_indices=indices_cpu.to(dev, non_blocking=True),
            last_page_len_cpu=(lens_cpu - 1) % page + 1,
            active_mask=torch.tensor([not r.finished for r in reqs]).to(dev, non_blocking=True),
        )

    @flashcheck.hot_path
    def step(self, batch: DecodeBatch, temperature: float = 1.0) -> torch.Tensor:
        t = self.timer.start()
        bs_real = batch.batch_size
        active = batch.num_active
        self.queue_depth.set(len(self.waiting))
        self.active_rows.set(active)
        if bs_real <= self.pool.buckets[-1]:
            logits = self.pool.replay(self.pool.pick(bs_real), batch, temperature)
        else:
            self.backend.init_forward_metadata(batch)
            temps = torch.full((bs_real,), temperature, device=self.device)
            logits = self.model(batch.input_ids, batch.out_loc, temps, bs_real)
        next_tokens = torch.argmax(logits, dim=-1)
        self.tokens_total.inc(next_tokens.numel())  # ok: FC101
        self.timer.stop(t)
        for ms in self.timer.collect():
            self.tpot_hist.observe(ms)
        self.autoscaler.record(bs_real, active)
        self.autoscaler.maybe_rescale(self.tpot_hist.quantile(0.99))
        return next_tokens
