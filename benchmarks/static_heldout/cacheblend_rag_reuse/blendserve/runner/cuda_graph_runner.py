"""Decode CUDA graphs per padded batch size (SGLang-style runner)."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from blendserve.batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from blendserve.runner.model_runner import ModelRunner


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    out: torch.Tensor


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner", buckets: list):
        self.model_runner = model_runner
        self.backend = model_runner.attn_backend
        self.device = model_runner.device
        self.buckets = sorted(buckets)
        self.max_bs = self.buckets[-1]
        self.pad_slot = -1
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.out_cache_loc = torch.full((self.max_bs,), self.pad_slot, dtype=torch.int64, device=self.device)
        self.graphs: dict[int, GraphEntry] = {}
        self.pool: Optional[tuple] = None
        self.backend.init_cuda_graph_state(self.buckets)

    def capture(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):
            self.graphs[bs] = self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> GraphEntry:
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
        )
        self.backend.init_forward_metadata_capture_cuda_graph(bs, self.seq_lens[:bs], fb)
        model = self.model_runner.model

        def run_once():
            return model.forward_decode(fb.input_ids, fb.positions, fb)

        for _ in range(2):
            run_once()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = run_once()
        if self.pool is None:
            self.pool = g.pool()
        return GraphEntry(g, fb.input_ids, fb.positions, out)

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode == ForwardMode.DECODE and fb.batch_size <= self.max_bs

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.buckets[bisect.bisect_left(self.buckets, raw_bs)]
        entry = self.graphs[bs]
        entry.input_ids[:raw_bs].copy_(fb.input_ids)
        entry.positions = fb.positions.clone()  # expect: FC107
        self.out_cache_loc = torch.full((bs,), self.pad_slot, dtype=torch.int64, device=self.device)  # expect: FC107
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, raw_bs, fb)
        entry.graph.replay()
        return entry.out[:raw_bs]
