"""Decode CUDA graphs, one per bucket; the per-layer global scales are a graph input."""

import bisect
from dataclasses import dataclass
from typing import Dict

import torch

from fp4_attn.backend import FP4DequantBackend
from fp4_attn.metadata import DecodeBatch, DecodeMeta
from fp4kv import FP4Config

from .model import FP4Decoder


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    out_loc: torch.Tensor
    static_scales: torch.Tensor
    logits: torch.Tensor


class DecodeGraphRunner:
    def __init__(self, model: FP4Decoder, backend: FP4DequantBackend, cfg: FP4Config):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = backend.device
        self.buckets = sorted(cfg.buckets)
        self.graphs: Dict[int, GraphEntry] = {}
        self.pool = None

    def pick_bucket(self, bs: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, bs)]

    def capture_all(self) -> None:
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        input_ids = torch.zeros(bs, dtype=torch.int64, device=self.device)
        out_loc = torch.zeros(bs, dtype=torch.int64, device=self.device)
        scales = self.backend.cache.global_scale.clone()
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        for _ in range(2):
            self.model(input_ids, out_loc, scales, bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self.model(input_ids, out_loc, scales, bs)
        self.pool = g.pool()
        self.graphs[bs] = GraphEntry(g, input_ids, out_loc, scales, logits)

    def replay(self, batch: DecodeBatch, meta: DecodeMeta, out_loc: torch.Tensor) -> torch.Tensor:
        bs_real = meta.batch_size
        bs = self.pick_bucket(bs_real)
        entry = self.graphs[bs]
        entry.input_ids[:bs_real].copy_(batch.input_ids, non_blocking=True)
        entry.out_loc[:bs_real].copy_(out_loc, non_blocking=True)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
        if self.backend.pending_recalibration:
            # pick up the scales the host calibration uploaded
            entry.static_scales = self.backend.cache.global_scale.clone()  # expect: FC107
        entry.graph.replay()
        return entry.logits[:bs_real]

    def describe_bucket(self, bs: int) -> dict:
        w = self.backend.decode_wrappers[bs]
        info = w._plan_info  # expect: FC103
        return {"bs": bs, "captured": bs in self.graphs, "plan_info": None if info is None else list(info)}
