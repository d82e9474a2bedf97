"""CUDA-graph capture and replay of the decode step, one graph per batch bucket."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tmeta.batch import ForwardBatch
from tmeta.config import GRAPH_BUCKETS, bucket_for
from tmeta.generic import BucketTable
from tmeta.metadata import DecodeMetadata

if TYPE_CHECKING:
    from runtime.model_runner import ModelRunner


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    meta: DecodeMetadata
    output: torch.Tensor


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner") -> None:
        self.model_runner = model_runner
        self.backend = model_runner.backend
        self.model = model_runner.model
        device = model_runner.device
        self.max_bs = model_runner.cfg.max_graph_bs
        self.buckets = [bs for bs in GRAPH_BUCKETS if bs <= self.max_bs]
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.graphs: BucketTable[int, GraphEntry] = BucketTable()
        self.mempool = torch.cuda.graph_pool_handle()
        self._current: tuple[int, int] = (0, 0)

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.kind == "decode" and batch.batch_size <= self.max_bs and len(self.graphs) > 0

    def capture(self) -> None:
        self.backend.init_cuda_graph_state()
        for bs in reversed(self.buckets):
            self.graphs.put(bs, self.capture_one_batch_size(bs))

    def capture_one_batch_size(self, bs: int) -> GraphEntry:
        meta = self.backend.init_forward_metadata_capture_cuda_graph(
            bs, self.req_pool_indices[:bs], self.seq_lens[:bs]
        )
        wrapper = meta.wrapper
        if wrapper is None or not wrapper.is_cuda_graph_enabled:  # ok: FC103
            raise RuntimeError(f"bucket {bs} has no graph-mode decode wrapper")
        if getattr(wrapper, "_plan_info", None) is None:  # expect: FC103
            raise RuntimeError(f"bucket {bs} was not planned before capture")
        for _ in range(2):
            self.model(self.input_ids[:bs], self.positions[:bs], "decode")
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = self.model(self.input_ids[:bs], self.positions[:bs], "decode")
        return GraphEntry(graph=graph, meta=meta, output=logits)

    def replay_prepare(self, batch: ForwardBatch) -> DecodeMetadata:
        raw_bs = batch.batch_size
        bs = bucket_for(raw_bs)
        self.input_ids[:raw_bs].copy_(batch.input_ids, non_blocking=True)
        self.positions[:raw_bs].copy_(batch.positions, non_blocking=True)
        self.req_pool_indices[:raw_bs].copy_(batch.req_pool_indices, non_blocking=True)
        self.seq_lens[:raw_bs].copy_(batch.seq_lens, non_blocking=True)
        self.seq_lens_cpu[:raw_bs].copy_(batch.seq_lens_cpu[:raw_bs])
        if raw_bs < bs:
            self.input_ids[raw_bs:bs].zero_()
            self.positions[raw_bs:bs].zero_()
            self.seq_lens_cpu[raw_bs:bs].fill_(1)
        meta = self.backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs]
        )
        if raw_bs < bs:
            self.seq_lens[raw_bs:bs].fill_(1)  # ok: FC104
        meta.seq_lens = self.seq_lens[:raw_bs].clone()  # ok: FC107
        self._current = (raw_bs, bs)
        return meta

    def replay_graph(self) -> torch.Tensor:
        raw_bs, bs = self._current
        entry = self.graphs[bs]
        entry.graph.replay()
        # Hand out logits the next replay will not overwrite.
        entry.output = entry.output.clone()  # expect: FC107
        return entry.output[:raw_bs]
