"""Decode CUDA graphs per batch size; replay prepares metadata through the backend."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Dict

import torch

from mserve.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from .model_runner import ModelRunner


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.backend = model_runner.attn_backend
        self.capture_bs = sorted(model_runner.cfg.cuda_graph_batch_sizes)
        self.max_bs = self.capture_bs[-1]
        device = model_runner.device
        self.backend.init_cuda_graph_state(self.max_bs)
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None
        self.capture()

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode == ForwardMode.DECODE and fb.batch_size <= self.max_bs

    def _static(self, bs: int, step_id: int = -1) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            step_id=step_id,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
        )

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._static(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        model = self.model_runner.model
        for _ in range(2):
            model.forward_decode(fb)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = model.forward_decode(fb)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        self.input_ids[:raw_bs].copy_(fb.input_ids, non_blocking=True)
        self.positions[:raw_bs].copy_(fb.positions, non_blocking=True)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices, non_blocking=True)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens, non_blocking=True)
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc, non_blocking=True)
        if bs > raw_bs:
            self.seq_lens[raw_bs:bs].fill_(1)
            self.out_cache_loc[raw_bs:bs].zero_()
        # hooks, metrics and the recorder see the real batch, not the padded one
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.backend.cuda_graph_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
