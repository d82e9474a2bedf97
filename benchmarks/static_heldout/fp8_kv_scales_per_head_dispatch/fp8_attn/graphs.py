"""Decode graphs per bucket; the fp8 layers run graph-mode wrappers bound to shared buffers."""

import bisect
from typing import Dict, Optional

import torch

from fp8kv.config import Fp8ServeConfig
from fp8_attn.backend import Fp8DispatchBackend
from fp8_attn.layers import Fp8Model
from fp8_attn.metadata import DecodeMeta, dummy_decode_meta
from fp8_attn.workspaces import graph_workspace


class Fp8GraphRunner:
    def __init__(self, model: Fp8Model, backend: Fp8DispatchBackend, cfg: Fp8ServeConfig, device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.buckets = sorted(cfg.decode_buckets)
        self.max_bs = self.buckets[-1]
        self.static_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_pos = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.static_logits: Dict[int, torch.Tensor] = {}
        self.mempool = None
        backend.init_graph_wrappers(graph_workspace(device))

    def bucket_for(self, n: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    def capture_all(self) -> None:
        for bs in reversed(self.buckets):
            self.capture_bucket(bs)

    def capture_bucket(self, bs: int) -> None:
        md = dummy_decode_meta(bs, self.cfg, self.device)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, md)
        ids, pos = self.static_ids[:bs], self.static_pos[:bs]
        for _ in range(2):
            self.model.forward_decode(ids, pos)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            self.static_logits[bs] = self.model.forward_decode(ids, pos)
        if self.mempool is None:
            self.mempool = graph.pool()
        self.graphs[bs] = graph

    def replay(self, md: DecodeMeta, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        n = md.batch_size
        bs = self.bucket_for(n)
        md.graph_bs = bs
        self.backend.init_forward_metadata_replay_cuda_graph(bs, md)
        self.static_ids[:n].copy_(input_ids, non_blocking=True)
        self.static_pos[:n].copy_(positions, non_blocking=True)
        self.graphs[bs].replay()
        return self.static_logits[bs][:n]
