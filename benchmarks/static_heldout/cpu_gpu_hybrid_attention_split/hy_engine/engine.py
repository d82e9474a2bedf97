"""The decode loop: GPU window graphs per layer, host attention for old tokens, LSE merge on the GPU."""

import bisect
import functools
import itertools
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

from hy_gpu.graphs import WindowGraphs
from hy_gpu.model import HybridModel, StepStatics
from hy_gpu.window_backend import WindowBackend
from hybridattn import HybridBatch, HybridConfig, SplitPlanner, cpu_token_counts

from .cpu_pool import CpuAttentionPool, FarJob
from .transfer import TransferManager


@dataclass
class HybridRequest:
    rid: int
    tokens: List[int]
    window_pages: List[int]                 # GPU pages of the window, oldest first
    host_pages_np: np.ndarray               # host pages older than the window
    inflight_pages: List[int] = field(default_factory=list)


def _indptr_cpu(counts: List[int]) -> torch.Tensor:
    return torch.tensor([0] + list(itertools.accumulate(counts)), dtype=torch.int32)


class HybridEngine:
    def __init__(self, cfg: HybridConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.planner = SplitPlanner(cfg.window, cfg.page_size)
        self.backend = WindowBackend(cfg, self.device)
        self.model = HybridModel(cfg, self.backend).to(self.device)
        self.statics = StepStatics.allocate(cfg, cfg.max_batch, self.device)
        self.graphs = WindowGraphs(self.model, self.backend, self.statics, cfg)
        host_shape = (cfg.num_layers, cfg.host_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.pool = CpuAttentionPool(cfg, torch.zeros(host_shape, dtype=cfg.dtype, pin_memory=True),
                                     torch.zeros(host_shape, dtype=cfg.dtype, pin_memory=True))
        self.transfer = TransferManager(self.statics, self.device, cfg.max_batch, cfg.num_qo_heads, cfg.head_dim)
        self.q_pinned = torch.zeros((cfg.max_batch, cfg.num_qo_heads, cfg.head_dim), dtype=cfg.dtype,
                                    pin_memory=True)
        self.q_ready = torch.cuda.Event()
        self.row_ids = torch.arange(cfg.max_batch, dtype=torch.int64, device=self.device)
        self.buckets: List[int] = sorted(cfg.buckets)

    def start(self) -> None:
        self.backend.init_window_buffers()
        self.graphs.record_all()

    def make_batch(self, reqs: List[HybridRequest]) -> HybridBatch:
        page, dev = self.cfg.page_size, self.device
        lens_cpu = torch.tensor([len(r.tokens) for r in reqs], dtype=torch.int32)
        split = self.planner.split(lens_cpu.numpy(), [r.host_pages_np for r in reqs])
        out_loc_cpu = torch.tensor([r.window_pages[-1] * page + (len(r.tokens) - 1) % page for r in reqs])
        near_cpu = torch.tensor([p for r in reqs for p in r.window_pages], dtype=torch.int32)
        inflight_cpu = torch.tensor([p for r in reqs for p in r.inflight_pages], dtype=torch.int32)
        return HybridBatch(
            req_ids=[r.rid for r in reqs],
            input_ids=torch.tensor([r.tokens[-1] for r in reqs]).to(dev, non_blocking=True),
            seq_lens=lens_cpu.to(dev, non_blocking=True),
            seq_lens_cpu=lens_cpu,
            out_loc=out_loc_cpu.to(dev, non_blocking=True),
            near_indptr_cpu=_indptr_cpu([len(r.window_pages) for r in reqs]),
            near_indices=near_cpu.to(dev, non_blocking=True),
            near_last_cpu=(lens_cpu - 1) % page + 1,
            inflight_indptr_cpu=_indptr_cpu([len(r.inflight_pages) for r in reqs]),
            inflight_indices=inflight_cpu.to(dev, non_blocking=True),
            inflight_last_cpu=torch.full((len(reqs),), page, dtype=torch.int32),
            far_pages=split.far_pages,
        )

    def decode_step(self, batch: HybridBatch) -> torch.Tensor:
        bs_real = batch.batch_size
        eager = bs_real > self.buckets[-1]
        bs = bs_real if eager else self.buckets[bisect.bisect_left(self.buckets, bs_real)]
        far_lens_np = np.asarray(cpu_token_counts(batch.seq_lens, self.cfg.window_pages, self.cfg.page_size))
        rows_np = np.flatnonzero(far_lens_np)
        far_lens = torch.clamp(batch.seq_lens - self.cfg.window, min=0)
        rows = self.row_ids[:bs_real][far_lens > 0]  # expect: FC101
        if eager:
            self.backend.prepare_overflow(batch)
            near = functools.partial(self.model.run_near, st=self.statics, bs=bs)
            tail = functools.partial(self.model.run_tail, st=self.statics, bs=bs)
        else:
            self.backend.prepare_window(bs, batch)
            near = functools.partial(self.graphs.replay_near, bs)
            tail = functools.partial(self.graphs.replay_tail, bs)
        self.statics.out_loc[:bs_real].copy_(batch.out_loc, non_blocking=True)
        self.statics.hidden[:bs_real].copy_(self.model.embed(batch.input_ids))
        for layer in range(self.cfg.num_layers):
            near(layer)
            self.q_pinned[:bs].copy_(self.statics.q[:bs], non_blocking=True)  # ok: FC101
            self.q_ready.record()
            job = FarJob(layer, self.q_pinned[:bs], self.q_ready, rows_np, far_lens_np[rows_np],
                         [batch.far_pages[r] for r in rows_np])
            fut = self.pool.submit(job)
            if fut is None:
                self.transfer.clear(bs)
            else:
                o_host, lse_host = fut.result()
                self.transfer.upload_partials(rows, o_host, lse_host, bs)
            tail(layer)
        self.slide_window(batch)
        return self.model.logits(self.statics.hidden[:bs_real])

    def slide_window(self, batch: HybridBatch) -> None:
        """Rows whose oldest window page left the window this step: drop it from the window's page list
        (its copy to the host was issued when the page filled)."""
        counts_np = np.diff(batch.near_indptr_cpu.numpy())
        leaving_np = (batch.seq_lens_cpu.numpy() % self.cfg.window) == 1
        if not leaving_np.any():
            return
        starts_np = batch.near_indptr_cpu.numpy()[:-1]
        keep_np = np.concatenate([np.arange(s + int(d), s + c) for s, c, d in zip(starts_np, counts_np, leaving_np)])
        keep = torch.from_numpy(keep_np).to(self.device, non_blocking=True)
        compacted = self.backend.kv_indices_buf.index_select(0, keep)
        self.backend.kv_indices_buf[: len(keep_np)].copy_(compacted)  # expect: FC104
