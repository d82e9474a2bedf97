"""CUDA graphs of the decode step, one per batch-size bucket, over every layer type's plugin."""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

import torch

from peab.batch import StepBatch
from peab.config import LAYER_FULL, EngineConfig
from peab_plugins.base import AttentionBackend, KVCache
from peab_runtime.model import Model

logger = logging.getLogger(__name__)


class BucketGraphRunner:
    def __init__(self, model: Model, backends: Dict[str, AttentionBackend], cfg: EngineConfig,
                 kv_caches: List[KVCache], device: torch.device):
        self.model, self.backends, self.cfg, self.kv_caches, self.device = model, backends, cfg, kv_caches, device
        self.buckets = sorted(b for b in cfg.graph_batch_sizes if b <= cfg.max_batch_size)
        self.max_bs = self.buckets[-1]
        self.graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.static_input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_slot_ids: Optional[torch.Tensor] = None
        self.stream = torch.cuda.Stream(device)
        self.pool = None

    def can_run(self, batch: StepBatch) -> bool:
        return batch.is_decode and batch.batch_size <= self.max_bs and bool(self.graphs)

    def _pick_bucket(self, n: int) -> int:
        return min(b for b in self.buckets if b >= n)  # ok: FC101

    def capture_all(self) -> None:
        assert not self.graphs, "decode graphs already captured"  # ok: FC109
        self.static_slot_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)  # ok: FC107
        for backend in self.backends.values():
            backend.init_graph_state(self.max_bs)
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):  # largest first: the smaller graphs share its pool
            self.record_bucket(bs)
        full = self.backends[LAYER_FULL]
        for bs in self.buckets:
            fixed = vars(full.graph_wrappers[bs]).get("_fixed_batch_size")  # expect: FC103
            if fixed is not None and fixed != bs:
                raise RuntimeError(f"graph wrapper of bucket {bs} was built for batch size {fixed}")
        # the capture plans left dummy page ids behind
        full.kv_indices.zero_()  # expect: FC104

    def record_bucket(self, bs: int) -> None:
        for backend in self.backends.values():
            backend.init_forward_metadata_capture_cuda_graph(bs)
        args = (self.static_input_ids[:bs], self.static_positions[:bs], self.static_slot_ids[:bs], self.kv_caches)
        with torch.cuda.stream(self.stream):
            for _ in range(2):  # warm-up launches let autotuned kernels settle before capture
                self.model.forward_decode(*args)
        self.stream.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = self.model.forward_decode(*args)
        self.pool = self.pool or graph.pool()
        self.graphs[bs] = (graph, out)
        logger.info("captured decode graph for batch size %d", bs)

    def replay(self, batch: StepBatch) -> torch.Tensor:
        assert batch.is_decode, "decode graphs replay decode batches only"  # expect: FC109
        real = batch.batch_size
        bs = self._pick_bucket(real)
        self.static_input_ids[: batch.qo_indptr[-1]].copy_(batch.input_ids)  # expect: FC101
        self.static_positions = torch.cat([batch.positions, self.static_positions[real:]])  # expect: FC107
        for backend in self.backends.values():
            backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        full = self.backends[LAYER_FULL]
        full.kv_indptr[real + 1 : bs + 1] = full.kv_indptr[real]  # expect: FC104
        self.static_slot_ids[:real].copy_(batch.slot_ids)  # ok: FC104
        self.static_slot_ids[real:bs].fill_(0)  # padding rows write the reserved page 0
        graph, out = self.graphs[bs]
        graph.replay()
        return out[:real]  # ok: FC101
