import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from .batch import StepBatch
from .lazy_backend import LazyFlashInferBackend
from .model import ServerlessLM

logger = logging.getLogger(__name__)


@dataclass
class CapturedBucket:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor
    hits: int = 0


@dataclass
class OnDemandGraphCache:
    """Captures a bucket the first time a batch of that size is seen, up to a budget of graphs."""

    model: ServerlessLM
    backend: LazyFlashInferBackend
    kv_cache: torch.Tensor
    buckets: List[int]
    max_graphs: int = 4
    entries: Dict[int, CapturedBucket] = field(default_factory=dict)
    seen_lens: List[int] = field(default_factory=list)
    pool: Optional[tuple] = None

    def bucket_for(self, bs: int) -> Optional[int]:
        return next((b for b in self.buckets if b >= bs), None)

    def capture_bucket(self, batch: StepBatch, padded: int) -> CapturedBucket:
        torch.cuda.synchronize()  # ok: FC101
        self.seen_lens = batch.seq_lens.tolist()  # expect: FC101
        dev = batch.tokens.device
        tokens = torch.zeros(padded, dtype=torch.int64, device=dev)
        positions = torch.zeros(padded, dtype=torch.int64, device=dev)
        # warm the kernels eagerly on the real batch before recording
        self.backend.plan_eager(batch)
        self.model(tokens, self.kv_cache, padded)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self.model(tokens, self.kv_cache, padded)
        self.pool = g.pool()
        self.backend.ensure_graph_wrapper(padded)
        self.backend.plan_graph(batch, padded)
        entry = CapturedBucket(graph=g, tokens=tokens, positions=positions, logits=logits)
        self.entries[padded] = entry
        return entry

    def replay(self, batch: StepBatch, padded: int) -> torch.Tensor:
        entry = self.entries[padded]
        self.backend.plan_graph(batch, padded)
        entry.tokens[: batch.bs].copy_(batch.tokens, non_blocking=True)
        entry.positions = batch.positions.clone()  # expect: FC107
        entry.hits += 1
        entry.graph.replay()
        return entry.logits[: batch.bs]
