"""Draft CUDA graphs: every draft level of one batch size captured into a single graph."""
from __future__ import annotations

import bisect
import logging
from typing import Dict, List, Optional

import torch

from eagle3spec.attention.tree_attn import FlashInferTreeMetadataBuilder
from eagle3spec.proposer import Eagle3Proposer

logger = logging.getLogger(__name__)


class DraftGraphRunner:
    def __init__(
        self, proposer: Eagle3Proposer, builder: FlashInferTreeMetadataBuilder, batch_sizes: List[int],
        device: str = "cuda",
    ) -> None:
        self.proposer = proposer
        self.builder = builder
        self.batch_sizes = sorted(batch_sizes)
        self.device = device
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        proposer.graph_runner = self
        proposer.init_graph_inputs()
        builder.init_draft_graph_buffers()

    def bucket_for(self, n: int) -> Optional[int]:
        i = bisect.bisect_left(self.batch_sizes, n)
        return self.batch_sizes[i] if i < len(self.batch_sizes) else None

    def capture_graphs(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        max_pages = self.builder.max_pages
        for bs in reversed(self.batch_sizes):
            meta = self.builder.build_for_cudagraph_capture(bs)
            # dummy requests: one page of context each, every page the scratch page 0
            seq_lens_cpu = torch.full((bs,), self.builder.page_size, dtype=torch.int32)
            block_table_cpu = torch.zeros(bs, max_pages, dtype=torch.int32)
            self.builder.prepare_draft_replay(bs, bs, seq_lens_cpu, block_table_cpu)
            for _ in range(2):
                self.proposer.run_levels(bs, meta)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.proposer.run_levels(bs, meta)
            self.pool = graph.pool()
            self.graphs[bs] = graph
            logger.info("captured draft graph bs=%d (%d levels)", bs, self.builder.depth)

    def replay(self, bs: int) -> None:
        self.graphs[bs].replay()
