"""Decode graphs of one replica, one per bucket; the standby's are recorded ahead of a failover."""

from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch.cuda import synchronize as cuda_sync

from rep_attn.backend import ReplicaBackend, StepMeta
from rep_run.model import ReplicaModel
from standby.config import ReplicaConfig
from standby.pages import PagePool


@dataclass
class BucketGraph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


class ReplicaGraphs:
    def __init__(self, model: ReplicaModel, backend: ReplicaBackend, pool: PagePool, cfg: ReplicaConfig, mempool=None):
        self.model = model
        self.backend = backend
        self.pool = pool
        self.kv_cache = pool.kv_cache
        self.cfg = cfg
        self.mempool = mempool
        self.device = pool.device
        self.buckets = sorted(cfg.decode_buckets)
        max_bs = self.buckets[-1]
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_slots = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.stream = torch.cuda.Stream(device=self.device)
        self.entries: Dict[int, BucketGraph] = {}
        self.bucket_index = {bs: i for i, bs in enumerate(self.buckets)}
        self.replay_counts_gpu = torch.zeros(len(self.buckets), dtype=torch.int64, device=self.device)

    def bucket_for(self, rows: int) -> int:
        for b in self.buckets:
            if b >= rows:
                return b
        return rows

    def record_buckets(self) -> None:
        cuda_sync()  # ok: FC101
        for bs in reversed(self.buckets):
            self.backend.prepare_bucket(bs, self.backend.dummy_meta(bs))
            args = (self.static_input_ids[:bs], self.kv_cache, self.static_slots[:bs])
            with torch.cuda.stream(self.stream):
                self.model.forward_decode(*args)  # warm-up
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.mempool, stream=self.stream):
                logits = self.model.forward_decode(*args)
            self.entries[bs] = BucketGraph(graph=g, logits=logits)

    def run_bucket(self, bs: int, meta: StepMeta, slots: torch.Tensor) -> torch.Tensor:
        n = meta.num_rows
        entry: Optional[BucketGraph] = self.entries.get(bs)
        if entry is None:
            if n > self.static_input_ids.numel():
                self.static_input_ids.resize_(n)  # expect: FC107
            self.static_input_ids[:n].copy_(meta.input_ids)
            return self.model.forward_decode(self.static_input_ids[:n], self.kv_cache, slots)
        self.static_input_ids[:n].copy_(meta.input_ids, non_blocking=True)
        self.static_slots[:n].copy_(slots, non_blocking=True)
        entry.graph.replay()
        self.replay_counts_gpu[self.bucket_index[bs]] += 1
        return entry.logits[:n]

    def rebind_to(self, pool: PagePool) -> None:
        for bs, w in self.backend.graph_wrappers.items():
            if not getattr(w, "is_cuda_graph_enabled", False):  # ok: FC103
                raise RuntimeError(f"bucket {bs}: the standby's wrapper is not in graph mode")
        if pool.kv_cache.data_ptr() != self.kv_cache.data_ptr():
            raise RuntimeError("graphs were recorded on another pool; record them again")
        self.pool = pool

    def replay_report(self) -> Dict[int, int]:
        counts = self.replay_counts_gpu.tolist()  # ok: FC101
        return {bs: counts[i] for bs, i in self.bucket_index.items()}
