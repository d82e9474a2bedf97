"""Engine loop: build a host record, move it, run the model, bring the results back."""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import torch
from torch.utils._pytree import tree_map

from prm_engine.config import EngineConfig
from prm_engine.model_runner import ModelRunner
from prm_engine.records import ForwardBatch
from prm_tree.move import move, to_host


class Engine:
    def __init__(self, cfg: EngineConfig, scheduler):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.scheduler = scheduler
        self.runner = ModelRunner(cfg)
        self.copy_stream = torch.cuda.Stream()
        self.out_host = torch.zeros(cfg.max_bs, dtype=torch.int64, pin_memory=True)

    def step(self) -> Dict[int, List[int]]:
        host_fb: ForwardBatch = self.scheduler.next_batch()
        fb = move(host_fb, self.device, non_blocking=True)
        lens = tree_map(lambda t: t.tolist(), {"seq_lens_cpu": fb.seq_lens_cpu})  # ok: FC101
        buckets = np.unique(np.asarray(lens["seq_lens_cpu"]) // self.cfg.page_size)  # ok: FC101
        self.scheduler.record_buckets(buckets)
        res = self.runner.forward(fb)
        if self.scheduler.pending_defrag is not None:
            perm, num_pages = self.scheduler.pending_defrag
            self.runner.compact_pages(perm, num_pages)
        n = fb.batch_size
        with torch.cuda.stream(self.copy_stream):
            self.out_host[:n].copy_(res.next_token_ids, non_blocking=True)  # ok: FC101
        self.copy_stream.synchronize()  # expect: FC101
        out = {rid: [int(t)] for rid, t in zip(self.scheduler.running_ids, self.out_host[:n].tolist())}
        if fb.return_logprob:
            host_res = res.cpu()
            self.scheduler.add_logprobs(host_res.logprobs)
            extra = to_host({"top": res.logprobs})
            self.scheduler.add_top_logprobs(extra["top"])
        finished = tree_map(lambda t: t.tolist(), {"eos": res.next_token_ids == self.cfg.eos_token_id})  # expect: FC101
        self.scheduler.finish(finished["eos"])
        return out
