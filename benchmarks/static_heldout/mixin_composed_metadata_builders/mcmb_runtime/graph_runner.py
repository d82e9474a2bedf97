"""Decode CUDA graphs per batch bucket, with whichever metadata builder the config picked."""
from __future__ import annotations

import logging
from typing import Dict

import torch
from torch.cuda import synchronize as cuda_sync

from mcmb.batches import BatchBase, DecodeBatch
from mcmb.config import BuilderConfig
from mcmb_builders.base import MetadataBuilderBase

logger = logging.getLogger(__name__)
# inputs the graph reads besides ids and positions
STATIC_EXTRAS = ("slot_mapping",)


class CudaGraphRunner:
    def __init__(self, cfg: BuilderConfig, builder: MetadataBuilderBase, model: torch.nn.Module, device: torch.device):
        self.cfg, self.builder, self.model, self.device = cfg, builder, model, device
        self.buckets = sorted(cfg.graph_batch_sizes)
        max_bs = self.buckets[-1]
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None
        self._use_cuda_graph = True  # ok: FC103

    def can_replay(self, batch: BatchBase) -> bool:
        return self._use_cuda_graph and isinstance(batch, DecodeBatch) and batch.num_seqs <= self.buckets[-1]

    def _bucket_for(self, n: int) -> int:
        assert n <= self.buckets[-1], f"{n} sequences exceed the largest graph"  # expect: FC109
        return next(b for b in self.buckets if b >= n)  # ok: FC101

    def capture_all(self) -> None:
        self.builder.init_graph_wrappers()
        cuda_sync()  # ok: FC101
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)
        stale = [bs for bs, w in self.builder.graph_wrappers.items() if not getattr(w, "_use_cuda_graph", True)]  # expect: FC103
        if stale:
            raise RuntimeError(f"decode wrappers for buckets {stale} were built outside graph mode")

    def capture_one_batch_size(self, bs: int) -> None:
        assert bs in self.builder.graph_wrappers, f"no graph-mode wrapper for batch size {bs}"  # expect: FC109
        meta = self.builder.build_for_cudagraph_capture(bs)
        args = (self.input_ids[:bs], self.positions[:bs], self.slot_mapping[:bs], meta)
        self.outputs[bs] = torch.empty(bs, self.cfg.vocab_size, dtype=torch.float32, device=self.device)  # ok: FC107
        for _ in range(2):  # warm-up: JIT and autotuning happen outside the capture
            self.model.forward_decode(*args)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[bs].copy_(self.model.forward_decode(*args))
        self.pool = self.pool or graph.pool()
        self.graphs[bs] = graph
        self.builder.graph_bufs["kv_last_page_len"][:bs].fill_(1)  # expect: FC104

    def prepare_replay(self, batch: DecodeBatch) -> int:
        real = batch.num_seqs
        bs = self._bucket_for(real)
        if batch.last_page_len_gpu is None:
            raise ValueError(f"decode batch without last-page lengths (seq_lens={batch.seq_lens})")  # ok: FC101
        self.builder.plan_replay(bs, batch)
        self.builder.graph_bufs["kv_last_page_len"][:real].copy_(batch.last_page_len_gpu)  # expect: FC104
        self.input_ids[:real].copy_(batch.input_ids)  # ok: FC104
        self.positions[:real].copy_(batch.positions)
        for name in STATIC_EXTRAS:
            setattr(self, name, getattr(batch, name).clone())  # expect: FC107
        cuda_sync()  # expect: FC101
        return bs

    def replay(self, batch: DecodeBatch) -> torch.Tensor:
        bs = self.prepare_replay(batch)
        logger.debug("replay bucket %d: seq_lens=%s", bs, str(batch.seq_lens))  # expect: FC101
        self.graphs[bs].replay()
        return self.outputs[bs][: batch.num_seqs]  # ok: FC101
