from collections import deque
from typing import Deque, Dict, List, Tuple

import ray
import torch

from raypp import MicroBatch, MicroBatchScheduler, PipelineConfig, Request, ShmChannel
from rp_stage.actor import StageActor


class PipelineDriver:
    """Schedules micro-batches over the stage actors, 1F-style: every actor
    gets every micro-batch in order, the channels carry the activations."""

    def __init__(self, cfg: PipelineConfig):
        self.cfg = cfg
        ray.init(ignore_reinit_error=True)
        names = [f"pp_act_{s}" for s in range(cfg.num_stages)]
        self.actors = [
            StageActor.remote(cfg, spec, names[spec.stage_id - 1] if spec.stage_id else "", names[spec.stage_id])
            for spec in cfg.stage_specs()
        ]
        self.scheduler = MicroBatchScheduler(cfg.microbatch_buckets, cfg.page_size, cfg.max_seq_len // cfg.page_size)
        self.token_channel: ShmChannel = None
        self.inflight: Deque[Tuple[MicroBatch, List]] = deque()
        self.requests: Dict[int, Request] = {}
        self.kv_tokens_in_flight = 0
        self.free_pages = list(range(cfg.max_pages - 1, 0, -1))

    def start(self) -> None:
        ray.get([a.record_graphs.remote() for a in self.actors])
        self.token_channel = ShmChannel(f"pp_act_{self.cfg.num_stages - 1}", self.cfg.channel_bytes(), torch.long)

    def add(self, req: Request) -> None:
        self.requests[req.req_id] = req
        self.scheduler.running.append(req)

    def schedule_step(self) -> None:
        for req in self.scheduler.running:
            if (req.seq_len - 1) // self.cfg.page_size >= len(req.pages):
                req.pages.append(self.free_pages.pop())
        for mb in self.scheduler.next_round(self.cfg.num_stages):
            self.kv_tokens_in_flight += int(mb.seq_lens_cpu.sum())  # ok: FC101
            refs = [a.execute_microbatch.remote(mb) for a in self.actors]
            self.inflight.append((mb, refs))
            while len(self.inflight) >= self.cfg.max_inflight:
                self._retire()

    def _retire(self) -> None:
        mb, refs = self.inflight.popleft()
        ray.get(refs)
        tokens = torch.empty(mb.num_reqs, dtype=torch.long)
        self.token_channel.recv_into(tokens)
        self.kv_tokens_in_flight -= int(mb.seq_lens_cpu.sum())
        for rid, tok in zip(mb.req_ids, tokens.tolist()):
            req = self.requests[rid]
            req.last_token = tok
            req.seq_len += 1
