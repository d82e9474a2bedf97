"""Decode graphs per bucket for fork batches (whole page lists, no cascade)."""

import bisect
import logging
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from agentkv.branches import BranchTable
from agentkv.config import AgentServeConfig
from agent_rt.cascade_backend import CascadeAgentBackend
from agent_rt.metadata import BranchMetadata, dummy_decode_metadata
from agent_rt.model import AgentModel

logger = logging.getLogger(__name__)


@dataclass
class BucketGraph:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor


class ForkGraphRunner:
    def __init__(self, model: AgentModel, backend: CascadeAgentBackend, table: BranchTable, cfg: AgentServeConfig):
        self.model = model
        self.backend = backend
        self.table = table
        self.cfg = cfg
        self.buckets = sorted(cfg.decode_buckets)
        self.graphs: Dict[int, BucketGraph] = {}
        self.mempool = None
        max_bs = cfg.max_graph_bs
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=backend.device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=backend.device)
        backend.init_graph_wrappers()

    def capture(self) -> None:
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)
        logger.info("captured %d fork-decode graphs", len(self.graphs))

    def capture_one_batch_size(self, bs: int) -> None:
        md = dummy_decode_metadata(self.cfg, bs, self.backend.device)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, md)
        input_ids = self.input_ids[:bs]
        positions = self.positions[:bs]
        for _ in range(2):
            self.model.forward_decode(input_ids, positions)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = self.model.forward_decode(input_ids, positions)
        if self.mempool is None:
            self.mempool = graph.pool()
        self.graphs[bs] = BucketGraph(graph, input_ids, positions, logits)

    def bucket_for(self, n: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    def replay(self, md: BranchMetadata, input_ids: torch.Tensor, positions: torch.Tensor) -> Optional[torch.Tensor]:
        n = md.batch_size
        bs = self.bucket_for(n)
        if bs is None or md.is_extend:
            return None
        if self.table.longest_branch_host > self.cfg.long_context_threshold:
            return None
        md.graph_bs = bs
        self.backend.init_forward_metadata_replay_cuda_graph(bs, md)
        entry = self.graphs[bs]
        entry.input_ids[:n].copy_(input_ids, non_blocking=True)
        entry.positions = torch.cat([positions, entry.positions[n:]])  # expect: FC107
        logger.debug("replay bs=%d (padded from %d), refcounts %s", bs, n, self.backend.pool.refcounts)  # ok: FC101
        entry.graph.replay()
        return entry.logits[:n]
