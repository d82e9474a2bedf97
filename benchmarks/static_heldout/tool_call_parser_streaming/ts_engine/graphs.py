"""Decode graphs per bucket: forward, greedy sampling and the single-token stop check."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import torch

from toolstream import ServerConfig, StopMatcher
from ts_engine.attention import ToolAttention
from ts_engine.model import ToolModel


@dataclass
class DecodeBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    kv_indptr_staged: torch.Tensor
    last_len_staged: torch.Tensor
    kv_indices: torch.Tensor
    num_rows: int
    num_pages: int


class BucketGraphs:
    _STATIC_INPUTS = ("input_ids", "positions")

    def __init__(self, model: ToolModel, attn: ToolAttention, stops: StopMatcher, cfg: ServerConfig, device) -> None:
        self.model, self.attn, self.stops, self.cfg = model, attn, stops, cfg
        b = cfg.max_graph_bs
        self.input_ids = torch.zeros(b, dtype=torch.int64, device=device)
        self.positions = torch.zeros(b, dtype=torch.int64, device=device)
        self.next_ids = torch.zeros(b, dtype=torch.int64, device=device)
        self.done = torch.zeros(b, dtype=torch.bool, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.mempool = None

    def _step(self, bs: int) -> torch.Tensor:
        nxt = self.model.decode(self.input_ids[:bs]).argmax(dim=-1)
        self.next_ids[:bs].copy_(nxt)
        self.done[:bs].copy_(self.stops.device_check(nxt))
        return nxt

    def capture_bucket(self, bs: int) -> None:
        self.attn.init_graph(bs)
        self.attn.bucket = bs
        warm = self._step(bs).clone()
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = self._step(bs)
            deterministic = torch.equal(out, warm)  # expect: FC101
        if not deterministic:
            raise RuntimeError(f"decode bucket {bs} captured differently from its eager warm-up")
        self.mempool = graph.pool()
        self.graphs[bs] = graph

    def replay_bucket(self, batch: DecodeBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        n = batch.num_rows
        bs = self.cfg.bucket_for(n)
        if batch.input_ids.shape[0] > self.input_ids.shape[0]:
            for name in self._STATIC_INPUTS:
                setattr(self, name, getattr(batch, name).clone())  # expect: FC107
        self.attn.kv_indices_buf[: batch.num_pages].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self.attn.plan_bucket(bs, batch.kv_indptr_staged, batch.last_len_staged)
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)  # ok: FC104
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        self.graphs[bs].replay()
        return self.next_ids[:n], self.done[:n]
