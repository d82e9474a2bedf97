"""The engine step: schedule, plan (holistic or fallback), run or replay, sample."""

from typing import Dict, List

import torch

from pba.backend.compat import total_workspace_bytes
from pba.backend.holistic import HolisticAttnBackend
from pba.config import EngineConfig
from pba.model import MixedModel
from pba.runtime.graph_runner import PersistentGraphRunner
from pba.scheduler import HolisticScheduler, Request


class PersistentEngine:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.scheduler = HolisticScheduler(cfg, cfg.max_batch_size, cfg.prefill_chunk, cfg.page_size, device)
        self.backend = HolisticAttnBackend(cfg, device)
        kv_caches = [
            torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.model = MixedModel(cfg, self.backend, kv_caches).to(device)
        self.runner = PersistentGraphRunner(cfg, self.model, self.backend, device)
        self.stop_flags = torch.zeros(cfg.max_batch_size, dtype=torch.bool, device=device)
        self.eos = torch.tensor(cfg.eos_token_id, device=device)
        self.pad_id = torch.tensor(0, device=device)
        self.out_pinned = torch.zeros(cfg.max_batch_size, dtype=torch.long, pin_memory=True)
        self.out_ready = torch.cuda.Event()

    def start(self) -> None:
        self.runner.warm_and_record()

    def step(self) -> List[Request]:
        sched = self.scheduler.schedule_step()
        if sched.aborted:
            self.runner.reset_static_inputs()
        info = sched.info
        bs = info.num_reqs
        if info.decode_only and self.runner.can_run(bs):
            logits = self.runner.replay(info, sched.input_ids)
            if self.cfg.lookahead and sched.tail is None:
                # a second token under the same plan: every row stays inside its last page
                self.backend.graph_kv_last_page_len[:bs].add_(1)  # expect: FC104
                logits = self.runner.relaunch(bs, torch.argmax(logits, dim=-1))
        else:
            if self.cfg.use_holistic:
                self.backend.plan_mixed(info)
            else:
                self.backend.plan_fallback(info)
            tail_ids = None
            if sched.tail is not None:
                self.backend.plan_chunked_tail(sched.tail)
                tail_ids = sched.input_ids[-1:]
            idx = sched.scratch.logits_idx
            torch.sub(info.qo_indptr[1:].long(), 1, out=idx)
            logits = self.model.mixed_forward(sched.input_ids, info.positions, idx, tail_ids)
        next_ids = torch.argmax(logits, dim=-1)
        stop = next_ids == self.eos
        self.stop_flags[:bs].copy_(stop)
        next_ids = torch.where(stop, self.pad_id, next_ids)  # ok: FC101
        self.out_pinned[:bs].copy_(next_ids, non_blocking=True)
        self.out_ready.record()
        finished = [r for i, r in enumerate(sched.requests) if self.stop_flags[i]]  # expect: FC101
        for r in finished:
            self.scheduler.running.remove(r)
        return finished

    def metrics(self) -> Dict[str, object]:
        return {
            "kv_layout": self.backend._kv_layout,  # ok: FC103
            "workspace_bytes": total_workspace_bytes(
                [self.backend.fallback_decode, self.backend.fallback_prefill, *self.backend.graph_decode.values()]
            ),
            "free_pages": len(self.scheduler.free_pages),
        }
