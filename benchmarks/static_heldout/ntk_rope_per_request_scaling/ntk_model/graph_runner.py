"""Decode graphs per bucket. Each graph reads its rows' NTK alpha from the backend's static
``row_scale_buf``; the last ``long_rows(bs)`` rows go through the long-context wrapper."""

from dataclasses import dataclass
from typing import Dict

import torch

from ntkserve import NTKConfig
from ntkserve.batch import StepBatch
from ntk_attn.backend import NTKAttentionBackend
from ntk_model.model import NTKModel


@dataclass
class GraphRecord:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor
    positions: torch.Tensor
    scale: torch.Tensor
    logits: torch.Tensor
    num_long: int


class DecodeGraphRunner:
    def __init__(self, cfg: NTKConfig, model: NTKModel, backend: NTKAttentionBackend, kv_cache: torch.Tensor):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        device = backend.device
        mb = max(cfg.buckets)
        self.static_tokens = torch.zeros(mb, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(mb, dtype=torch.int64, device=device)
        self.graphs: Dict[int, GraphRecord] = {}
        self.pool = None
        self.scaled_replays = 0

    def pick_bucket(self, n: int) -> int:
        for b in self.cfg.buckets:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} is larger than the largest bucket")

    def capture_all(self) -> None:
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.capture_one_batch_size(bs)
        self.backend.check_graph_wrappers()

    def capture_one_batch_size(self, bs: int) -> None:
        num_long = self.cfg.long_rows(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, num_long)
        tokens = self.static_tokens[:bs]
        positions = self.static_positions[:bs]
        scale = self.backend.row_scale_buf[:bs]
        for _ in range(2):
            self.model.forward_decode(tokens, positions, scale, self.kv_cache, bs, num_long)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self.model.forward_decode(tokens, positions, scale, self.kv_cache, bs, num_long)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs] = GraphRecord(
            graph=g, tokens=tokens, positions=positions, scale=scale, logits=logits, num_long=num_long
        )

    def replay(self, batch: StepBatch) -> torch.Tensor:
        real = batch.batch_size
        bs = self.pick_bucket(real)
        rec = self.graphs[bs]
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        rec.tokens[:real].copy_(batch.tokens_dev)
        rec.positions = batch.positions_dev.clone()  # expect: FC107
        if rec.scale[:real].max().item() > 1.0:  # expect: FC101
            self.scaled_replays += 1
        rec.graph.replay()
        return rec.logits[:real]
