"""Decode graphs per batch bucket over the dequantize-then-decode forward."""
from __future__ import annotations

import bisect
from typing import Dict, Optional

import torch

from qkv.config import QuantKVConfig
from qkv_engine.attention import DecodeInputs, QuantDecodeAttention
from qkv_engine.model import QuantLM


class DecodeGraphBank:
    def __init__(self, model: QuantLM, attn: QuantDecodeAttention, cfg: QuantKVConfig):
        self.model = model
        self.attn = attn
        self.cfg = cfg
        self.buckets = sorted(cfg.graph_buckets)
        max_bs = self.buckets[-1]
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=attn.device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=attn.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = torch.cuda.graph_pool_handle()

    def record_all(self) -> None:
        for bs in reversed(self.buckets):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        self.attn.make_graph_wrapper(bs)
        self.attn.stage_decode(bs, bs, DecodeInputs.dummy(bs, self.cfg.page_size))
        torch.cuda.synchronize()  # ok: FC101
        for _ in range(2):
            self.model.forward_decode(self.input_ids[:bs], self.positions[:bs], bs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = self.model.forward_decode(self.input_ids[:bs], self.positions[:bs], bs)
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def bucket_for(self, raw_bs: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, raw_bs)
        return self.buckets[i] if i < len(self.buckets) else None

    def replay(self, raw_bs: int, inputs: DecodeInputs, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        bs = self.bucket_for(raw_bs)
        if bs is None or bs not in self.graphs:
            self.attn.stage_decode(raw_bs, raw_bs, inputs)
            return self.model.forward_decode(input_ids, positions, raw_bs)
        self.input_ids[:raw_bs].copy_(input_ids)
        self.positions[:raw_bs].copy_(positions)
        self.attn.stage_decode(raw_bs, bs, inputs)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
