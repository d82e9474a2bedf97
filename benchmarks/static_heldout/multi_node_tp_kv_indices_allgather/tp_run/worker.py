"""One TP rank: rank 0 schedules and broadcasts, every rank plans and replays."""
from __future__ import annotations

import time
from typing import Optional

import torch
import torch.distributed as dist

from tpdist import MetadataBroadcaster, Rank0Scheduler, TPConfig
from tp_attn.backend import RankAttnBackend
from tp_run.graphs import RankGraphRunner
from tp_run.model import TPModel


class TPWorker:
    def __init__(self, cfg: TPConfig, device: torch.device, group: dist.ProcessGroup,
                 cpu_group: dist.ProcessGroup):
        self.cfg = cfg
        self.device = device
        self.backend = RankAttnBackend(cfg, device)
        self.backend.init_graph_wrappers()
        self.broadcaster = MetadataBroadcaster(
            cfg, group, cpu_group, cfg.world_size, device, landing=self.backend.kv_indices_buf
        )
        self.scheduler: Optional[Rank0Scheduler] = Rank0Scheduler(cfg) if cfg.rank == 0 else None
        kv_caches = [
            torch.zeros(cfg.max_pages, 2, cfg.page_size, cfg.kv_heads_per_rank, cfg.head_dim,
                        dtype=torch.bfloat16, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.model = TPModel(cfg, self.backend, group, kv_caches)
        self.runner = RankGraphRunner(cfg, self.backend, self.model, device)
        self.last_bs = 0
        self.lat_hist_cpu = torch.zeros(0, dtype=torch.float64)

    def warmup(self) -> None:
        self.runner.record_all()

    def headroom(self) -> int:
        free, _ = torch.cuda.mem_get_info(self.device)
        return free

    def step(self) -> torch.Tensor:
        t0 = time.perf_counter()
        plan = self.scheduler.schedule() if self.scheduler is not None else None
        meta = self.broadcaster.broadcast_step(plan, self.headroom())
        if self.scheduler is not None:
            self.scheduler.update_headroom(self.broadcaster.last_headroom)
        if meta.is_prefill:
            self.backend.plan_prefill(meta, plan)
            logits = self.model.forward_prefill(meta.input_ids, meta.positions)
        elif meta.batch_size > self.cfg.largest_bucket:
            self.backend.plan_overflow(meta)
            logits = self.model.forward_decode(meta.input_ids, meta.positions)
        else:
            if meta.batch_size > self.last_bs:
                # the admitted rows need their lengths where the graphs read them
                self.runner.static_lens = meta.seq_lens.clone()  # expect: FC107
            logits = self.runner.replay(meta)
        self.last_bs = meta.batch_size
        dt = time.perf_counter() - t0
        self.lat_hist_cpu = torch.cat([self.lat_hist_cpu, torch.tensor([dt], dtype=torch.float64)])  # ok: FC107
        return logits
