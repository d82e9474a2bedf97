"""Decode graphs per bucket; the autoscaler rebuilds the bucket set between steps."""

import bisect
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from slo import SLOConfig, StepTimer
from slo_attn.backend import MeteredBackend
from slo_attn.batch import DecodeBatch

from .model import DecodeModel


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    temperature: torch.Tensor
    logits: torch.Tensor


class GraphPool:
    def __init__(self, model: DecodeModel, backend: MeteredBackend, cfg: SLOConfig, timer: StepTimer):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.timer = timer
        self.device = backend.device
        self.buckets: Tuple[int, ...] = tuple(sorted(cfg.initial_buckets))
        self.graphs: Dict[int, GraphEntry] = {}
        self.mempool = None
        self.last_temperature: Optional[float] = None

    def pick(self, bs: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, bs)]

    def capture_all(self) -> None:
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        input_ids = torch.zeros(bs, dtype=torch.int64, device=self.device)
        temperature = torch.ones(bs, dtype=torch.float32, device=self.device)
        out_loc = self.backend.out_loc_buf[:bs]
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        self.model(input_ids, out_loc, temperature, bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            logits = self.model(input_ids, out_loc, temperature, bs)
        self.mempool = g.pool()
        self.graphs[bs] = GraphEntry(g, input_ids, temperature, logits)

    def replay(self, bs: int, batch: DecodeBatch, temperature: float) -> torch.Tensor:
        bs_real = batch.batch_size
        entry = self.graphs[bs]
        entry.input_ids[:bs_real].copy_(batch.input_ids, non_blocking=True)
        self.backend.out_loc_buf[:bs_real].copy_(batch.out_loc, non_blocking=True)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch, batch.seq_lens)
        if temperature != self.last_temperature:
            entry.temperature = torch.full((bs,), temperature, dtype=torch.float32, device=self.device)  # expect: FC107
            self.last_temperature = temperature
        entry.graph.replay()
        return entry.logits[:bs_real]

    # ------------------------------------------------------ autoscaler hooks
    def probe_latency(self, bs: int) -> float:
        """One replay of bucket `bs` with every row on a full last page: the bucket's worst-case step."""
        entry = self.graphs[bs]
        self.backend.last_page_len_buf[:bs].fill_(self.cfg.page_size)  # expect: FC104
        i = self.timer.start()
        entry.graph.replay()
        return self.timer.stop(i, wait=True)

    def rebuild_buckets(self, buckets: Tuple[int, ...]) -> None:
        keep = set(buckets) & set(self.graphs)
        for bs in [b for b in self.graphs if b not in keep]:
            self.demote(bs)
        self.backend.grow_graph_buffers(max(buckets))
        for bs in sorted(set(buckets) - keep, reverse=True):
            if len(self.backend.graph_wrappers) >= self.cfg.max_graphs:
                self.backend.add_spill_bucket(bs)
            else:
                self.backend.add_bucket(bs)
            self.capture_one_batch_size(bs)
        self.buckets = tuple(sorted(buckets))

    def demote(self, bs: int) -> None:
        """Drop a bucket's graph; keep its wrapper for eager use."""
        w = self.backend.graph_wrappers.pop(bs)
        w._use_cuda_graph = False  # expect: FC103
        self.backend.retired.append(w)
        del self.graphs[bs]
