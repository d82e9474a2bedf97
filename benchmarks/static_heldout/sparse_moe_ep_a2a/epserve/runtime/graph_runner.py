"""Decode CUDA graphs per batch-size bucket; a bucket's graph runs both micro-batches of a split step."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List

import torch

from epserve.config import EPConfig
from epserve.layers import MicroBatchAttnBackend, MicroBatchMeta
from epserve.model import EPModel
from epserve.runtime.tbo import TwoBatchSplitter

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    output: torch.Tensor


class EPGraphRunner:
    def __init__(self, model: EPModel, backend: MicroBatchAttnBackend, splitter: TwoBatchSplitter, cfg: EPConfig, device: torch.device):
        self.model = model
        self.backend = backend
        self.splitter = splitter
        self.cfg = cfg
        self.device = device
        max_bs = max(cfg.graph_buckets)
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_kv_len = torch.full((max_bs,), cfg.page_size, dtype=torch.int32, device=device)
        self.entries: Dict[int, GraphEntry] = {}
        self.pool = None

    def record_all(self) -> None:
        self.backend.init_graph_wrappers()
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        metas = self.splitter.dummy(bs)
        self.backend.prepare_micro_batches(metas)
        ids, pos = self.static_input_ids[:bs], self.static_positions[:bs]
        self.model.forward_decode(ids, pos, metas)
        total = self.static_kv_len[:bs].sum().item()  # expect: FC101
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.forward_decode(ids, pos, metas)
        if self.pool is None:
            self.pool = graph.pool()
        self.entries[bs] = GraphEntry(graph=graph, input_ids=ids, positions=pos, output=out)
        logger.info("recorded decode graph for %d requests (%d KV tokens, %d micro-batches)", bs, total, len(metas))

    def bucket_for(self, bs: int) -> int:
        for b in self.cfg.graph_buckets:
            if b >= bs:
                return b
        return 0

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, metas: List[MicroBatchMeta], bs: int) -> torch.Tensor:
        entry = self.entries[self.bucket_for(bs)]
        entry.input_ids[:bs].copy_(input_ids, non_blocking=True)
        entry.positions = positions.clone()  # expect: FC107
        self.backend.prepare_micro_batches(metas)
        entry.graph.replay()
        return entry.output[:bs]
