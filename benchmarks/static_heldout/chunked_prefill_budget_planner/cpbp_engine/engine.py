"""The engine loop: schedule, build host metadata, replay a decode graph or run a mixed step."""

from __future__ import annotations

from typing import List

import torch

from cpbp import PAGE_SIZE, PageAllocator, Request, SchedulerConfig, TokenBudgetScheduler
from cpbp_attn.backend import MixedBatchBackend, MixedMetadataBuilder
from cpbp_attn.host_meta import build_host_meta, make_step_input
from cpbp_engine.graph_runner import DecodeGraphRunner
from cpbp_engine.model import TinyModel


class Engine:
    def __init__(self, cfg: SchedulerConfig, device: str = "cuda", eos_id: int = 2):
        self.cfg, self.device, self.eos_id = cfg, torch.device(device), eos_id
        self.allocator = PageAllocator(cfg.num_pages)
        self.scheduler = TokenBudgetScheduler(cfg, self.allocator)
        self.backend = MixedBatchBackend(cfg, self.device)
        self.builder = MixedMetadataBuilder(self.backend)
        self.model = TinyModel(cfg, self.backend, self.device).to(self.device)
        self.runner = DecodeGraphRunner(self.model, self.backend, cfg, self.device)
        self.runner.capture_all()

    def step(self) -> List[Request]:
        plan = self.scheduler.schedule()
        if not plan.rows:
            return []
        host = build_host_meta(plan, PAGE_SIZE)
        step = make_step_input(plan, host, self.device, PAGE_SIZE)
        bs = self.runner.bucket_for(len(plan.rows))
        if plan.num_prefills == 0 and bs is not None and bs in self.runner.entries:
            logits = self.runner.replay(step)
            for i, row in enumerate(plan.rows):
                row.req.graph_offset = int(host.kv_indptr_np[i])
        else:
            meta = self.builder.build(step)
            hidden_logits = self.model.forward_mixed(step.input_ids, step.positions, step.slot_mapping, meta)
            logits = hidden_logits[step.query_start_loc[1:] - 1]
        sampled = torch.argmax(logits, dim=-1).tolist()
        done = self.scheduler.advance(plan, sampled, self.eos_id)
        for req in done:
            self.release(req)
        return done

    def release(self, req: Request) -> None:
        if req.graph_offset is not None and self.runner.entries:
            # the freed pages go back to the pool: point the stale graph row at the null page
            self.backend.kv_indices_buf[req.graph_offset : req.graph_offset + len(req.pages)].zero_()  # expect: FC104
        self.allocator.release(req.pages)
        req.pages = []
        req.graph_offset = None
