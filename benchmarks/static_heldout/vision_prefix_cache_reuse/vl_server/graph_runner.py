"""Decode CUDA graphs per batch-size bucket."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from vl_model.attention import VLAttentionBackend
from vl_model.config import VLConfig
from vl_model.metadata import VLBatch
from vl_model.model import VLModel

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor  # [3, bs] mrope positions
    rope_deltas: torch.Tensor  # [3, bs]: image grids shift the text positions of every request
    slot_pages: torch.Tensor
    slot_offsets: torch.Tensor
    out: Optional[torch.Tensor] = None


class DecodeGraphRunner:
    def __init__(self, model: VLModel, backend: VLAttentionBackend, cfg: VLConfig, device: torch.device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.buckets: List[int] = sorted(cfg.graph_buckets)
        self.graphs: Dict[int, GraphEntry] = {}
        self.seq_lens = torch.zeros(max(self.buckets), dtype=torch.int32, device=device)
        self.max_ctx = cfg.max_model_len
        self.pool = None
        backend.init_cuda_graph_state(self.buckets)

    def bucket_for(self, n: int) -> Optional[int]:
        return next((b for b in self.buckets if b >= n), None)

    def capture_all(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)
        logger.info("captured %d decode graphs", len(self.graphs))

    def capture_one_batch_size(self, bs: int) -> None:
        torch.cuda.synchronize()  # ok: FC101
        dev = self.device
        entry = GraphEntry(
            torch.cuda.CUDAGraph(),
            input_ids=torch.zeros(bs, dtype=torch.int64, device=dev),
            positions=torch.zeros(3, bs, dtype=torch.int64, device=dev),
            rope_deltas=torch.zeros(3, bs, dtype=torch.int64, device=dev),
            slot_pages=torch.zeros(bs, dtype=torch.int64, device=dev),
            slot_offsets=torch.zeros(bs, dtype=torch.int64, device=dev),
        )
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        args = (entry.input_ids, entry.positions, entry.rope_deltas, entry.slot_pages, entry.slot_offsets)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.model.forward_decode(*args)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(entry.graph, pool=self.pool):
            entry.out = self.model.forward_decode(*args)
        self.graphs[bs] = entry

    def replay(self, batch: VLBatch, input_ids: torch.Tensor, positions: torch.Tensor, rope_deltas: torch.Tensor,
               slot_pages: torch.Tensor, slot_offsets: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        n = len(batch.reqs)
        bs = self.bucket_for(n)
        entry = self.graphs[bs]
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        entry.input_ids[:n].copy_(input_ids)
        entry.positions[:, :n].copy_(positions)
        entry.slot_pages[:n].copy_(slot_pages)
        entry.slot_offsets[:n].copy_(slot_offsets)
        self.seq_lens[:n].copy_(seq_lens)
        if (self.seq_lens[:n] >= self.max_ctx).any():  # expect: FC101
            raise RuntimeError(f"a request in this batch of {n} reached the context limit {self.max_ctx}")
        if batch.image_rows == 0:
            entry.rope_deltas = torch.zeros_like(entry.rope_deltas)  # expect: FC107
        else:
            entry.rope_deltas[:, :n].copy_(rope_deltas)
        entry.graph.replay()
        return entry.out[:n]
