"""Decode graphs per bucket."""

from __future__ import annotations

from typing import Dict, List

import torch

from kvx import TransferConfig
from kx_decode.backend import DecodeAttnBackend
from kx_decode.model import DecodeModel


class DecodeGraphs:
    def __init__(self, cfg: TransferConfig, model: DecodeModel, backend: DecodeAttnBackend, kv_cache, device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        self.device = device
        self.static_ids = {bs: torch.zeros(bs, dtype=torch.int64, device=device) for bs in cfg.buckets}
        self.static_positions = {bs: torch.zeros(bs, dtype=torch.int64, device=device) for bs in cfg.buckets}
        self.static_seq_lens = torch.ones(cfg.max_batch, dtype=torch.int32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}

    def record_all(self) -> None:
        self.backend.init_decode_buffers()
        torch.cuda.synchronize()  # ok: FC101
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.backend.plan_for_capture(bs)
            max_len = self.static_seq_lens[:bs].max().item()  # expect: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self.model.forward_decode(self.static_ids[bs], self.static_positions[bs], self.kv_cache, max_len)
            self.outputs[bs] = out
            self.graphs[bs] = graph

    def run_bucket(self, n: int, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        bs = self.cfg.bucket_for(n)
        self.static_ids[bs][:n].copy_(input_ids)
        self.static_positions[bs] = torch.zeros(bs, dtype=torch.int64, device=self.device)  # expect: FC107
        self.static_positions[bs][:n].copy_(positions)
        self.backend.prepare_bucket(bs, n)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]

    def capture_report(self) -> Dict[int, List[int]]:
        return {bs: self.static_seq_lens[:bs].tolist() for bs in sorted(self.graphs)}  # ok: FC101
