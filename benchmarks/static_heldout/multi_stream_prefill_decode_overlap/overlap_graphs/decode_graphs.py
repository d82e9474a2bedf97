"""Decode graphs per bucket, captured and replayed on the decode stream."""

from typing import Dict

import torch

from overlap import DecodeBatch, OverlapConfig, StreamSet
from overlap_attn.lanes import DecodeLane, decode_plan_kwargs
from overlap_graphs.model import OverlapModel


class DecodeGraphPool:
    def __init__(self, cfg: OverlapConfig, model: OverlapModel, lane: DecodeLane, streams: StreamSet, kv_cache):
        self.cfg = cfg
        self.model = model
        self.lane = lane
        self.streams = streams
        self.kv_cache = kv_cache
        device = lane.bufs.device
        mb = max(cfg.buckets)
        self.static_inputs = {
            "tokens": torch.zeros(mb, dtype=torch.int64, device=device),
            "positions": torch.zeros(mb, dtype=torch.int64, device=device),
        }
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = torch.cuda.graph_pool_handle()

    def bucket_for(self, n: int) -> int:
        for b in self.cfg.buckets:
            if b >= n:
                return b
        raise ValueError(f"{n} decode rows exceed the largest bucket")

    def capture_decode_graphs(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        with torch.cuda.stream(self.streams.decode):
            for bs in sorted(self.cfg.buckets, reverse=True):
                self._capture_one(bs)
        self.streams.decode.synchronize()

    def _capture_one(self, bs: int) -> None:
        w = self.lane.build_graph_wrapper(bs)
        kw = decode_plan_kwargs(self.cfg)
        dummy_indptr = torch.arange(bs + 1, dtype=torch.int32)
        dummy_last = torch.ones(bs, dtype=torch.int32)
        w.plan(dummy_indptr, self.lane.bufs.kv_indices["decode"][:bs], dummy_last, **kw)
        h = self.cfg.handoff_rows
        if h:
            self.lane.handoff.plan(dummy_indptr[: h + 1], self.lane.bufs.kv_indices["decode"][:h], dummy_last[:h], **kw)
        tokens = self.static_inputs["tokens"][:bs]
        positions = self.static_inputs["positions"][:bs]
        self.model.decode(tokens, positions, self.kv_cache, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool, stream=self.streams.decode):
            self.outputs[bs] = self.model.decode(tokens, positions, self.kv_cache, bs)
        self.graphs[bs] = g

    def replay_bucket(self, batch: DecodeBatch) -> torch.Tensor:
        real = batch.batch_size
        bs = self.bucket_for(real)
        self.lane.replay(bs, batch)
        with torch.cuda.stream(self.streams.decode):
            self.static_inputs["tokens"][:real].copy_(batch.tokens, non_blocking=True)
            self.static_inputs["positions"] = batch.positions.clone()  # expect: FC107
            self.graphs[bs].replay()
            self.streams.decode_done.record(self.streams.decode)
        return self.outputs[bs][:real]
