from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from duoserve.runner.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from duoserve.runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        cfg = model_runner.cfg
        self.capture_bs = sorted(b for b in cfg.cuda_graph_bs if b <= cfg.max_running_requests)
        self.max_bs = self.capture_bs[-1]
        self.device = model_runner.device
        model_runner.attn_backend.init_cuda_graph_state(self.max_bs)
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.req_slots = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32)
        self.full_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def can_run(self, fb: ForwardBatch) -> bool:
        return self.model_runner.attn_backend.graphs_enabled and fb.batch_size <= self.max_bs

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        mr = self.model_runner
        backend = mr.attn_backend
        backend.init_forward_metadata_capture_cuda_graph(bs, self.req_slots[:bs], self.seq_lens[:bs])
        fb = ForwardBatch(ForwardMode.DECODE, bs, self.input_ids[:bs], self.positions[:bs], self.req_slots[:bs],
                          np.zeros(bs, dtype=np.int64), self.seq_lens[:bs], self.seq_lens_cpu[:bs],
                          full_loc=self.full_loc[:bs])
        page = mr.kv_pool.page_size

        def run_once() -> torch.Tensor:
            fb.stream_loc = mr.kv_pool.stream_base_gpu[fb.req_slots] * page + backend.ring_slot[:bs]
            return mr.model.forward_decode(fb.input_ids, fb.positions, fb)

        for _ in range(2):
            run_once()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = run_once()
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.req_slots[:raw_bs].copy_(fb.req_slots)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        if raw_bs < bs:
            self.seq_lens[raw_bs:bs].fill_(1)
            self.seq_lens_cpu[raw_bs:bs].fill_(1)
        full_loc, _ = self.model_runner.kv_pool.append_decode_slots(fb.req_slots, fb.seq_lens)
        self.full_loc[:raw_bs].copy_(full_loc)
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, self.req_slots, self.seq_lens, self.seq_lens_cpu, fb.req_slots_np)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
