from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Dict

import torch

from sloserve.config import GRAPH_BUCKETS
from sloserve.model import StepBatch
from sloserve.scheduler import StepPlan

if TYPE_CHECKING:
    from sloserve.engine import SloEngine

logger = logging.getLogger(__name__)


class SloGraphRunner:
    def __init__(self, engine: "SloEngine"):
        self.attn = engine.attn
        self.model = engine.model
        self.device = engine.device
        self.buckets = list(GRAPH_BUCKETS)
        self.max_bs = self.buckets[-1]
        dev, n = self.device, self.max_bs
        self.static_input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.static_positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.static_rows = torch.zeros(n, dtype=torch.int64, device=dev)
        self.static_seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.static_out_loc = torch.zeros(n, dtype=torch.int64, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: Dict[int, torch.Tensor] = {}
        self.pool = None

    def _static_batch(self, bs: int) -> StepBatch:
        return StepBatch(
            batch_size=bs,
            input_ids=self.static_input_ids[:bs],
            positions=self.static_positions[:bs],
            rows=self.static_rows[:bs],
            seq_lens=self.static_seq_lens[:bs],
            out_loc=self.static_out_loc[:bs],
        )

    def capture(self) -> None:
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        self.attn.init_forward_metadata_capture_cuda_graph(bs)
        fb = self._static_batch(bs)
        for _ in range(2):
            self.model.run_step(fb, decode=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.model.run_step(fb, decode=True)
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.logits[bs] = logits
        logger.info("captured bucket %d, dummy seq_lens %s", bs, str(self.static_seq_lens[:bs]))  # expect: FC101

    def bucket_for(self, n: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def replay(self, fb: StepBatch, step: StepPlan) -> torch.Tensor:
        n = fb.batch_size
        bs = self.bucket_for(n)
        if not torch.equal(self.static_rows[:n], fb.rows):  # expect: FC101
            self.static_rows[:n].copy_(fb.rows)
        self.static_input_ids[:n].copy_(fb.input_ids)
        self.static_positions[:n].copy_(fb.positions)
        self.static_seq_lens[:n].copy_(fb.seq_lens)
        self.static_out_loc[:n].copy_(fb.out_loc)
        if n < bs:
            self.static_out_loc[n:bs].zero_()
        self.attn.prepare_decode(bs, step)
        self.graphs[bs].replay()
        return self.logits[bs][:n]
