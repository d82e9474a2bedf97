"""One decode graph per batch bucket: attention, penalties and sampling are recorded together."""
from __future__ import annotations

import logging
from typing import Dict, Tuple

import numpy as np
import torch

from penaltyserve.attn.backend import DecodeAttnBackend
from penaltyserve.config import EngineConfig
from penaltyserve.model import PenaltyLM
from penaltyserve.sampling.sampler import GraphSampler

logger = logging.getLogger(__name__)


class DecodeGraphRunner:
    def __init__(self, cfg: EngineConfig, model: PenaltyLM, backend: DecodeAttnBackend, sampler: GraphSampler) -> None:
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.sampler = sampler
        dev = torch.device(cfg.device)
        max_bs = max(cfg.graph_buckets)
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.out_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.last_logits = torch.zeros(max_bs, cfg.vocab_size, dtype=torch.float32, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        # bucket -> (rows, pages) of the last plan, to log re-plans of padded buckets
        self._plan_info: Dict[int, Tuple[int, int]] = {}  # ok: FC103

    def _forward(self, bucket: int) -> torch.Tensor:
        logits = self.model(self.input_ids[:bucket], bucket)
        self.last_logits[:bucket].copy_(logits)
        ids = self.sampler.sample_in_graph(logits, bucket)
        self.out_ids[:bucket].copy_(ids)
        return self.out_ids[:bucket]

    def record_bucket(self, bucket: int) -> None:
        self.backend.warm_plan(bucket)
        torch.cuda.synchronize()  # ok: FC101
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(bucket)
        torch.cuda.current_stream().wait_stream(side)
        if not torch.isfinite(self.last_logits[:bucket]).all():  # expect: FC101
            raise RuntimeError(f"non-finite logits in the warm-up of bucket {bucket}")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._forward(bucket)
        self.pool = graph.pool()
        self.graphs[bucket] = graph

    def record_all(self) -> None:
        self.backend.init_graph_wrappers()
        for bucket in sorted(self.cfg.graph_buckets, reverse=True):
            self.record_bucket(bucket)

    def bucket_for(self, bs: int):
        for bucket in sorted(self.cfg.graph_buckets):
            if bucket >= bs:
                return bucket
        return None

    def replay(
        self,
        bucket: int,
        bs: int,
        input_ids_cpu: torch.Tensor,
        indptr_np: np.ndarray,
        indices_np: np.ndarray,
        last_np: np.ndarray,
    ) -> torch.Tensor:
        self.input_ids[:bs].copy_(input_ids_cpu[:bs], non_blocking=True)
        self.backend.load_replay_inputs(bucket, bs, indptr_np, indices_np, last_np)
        view = self.backend.graph_view(bucket)
        view.last_page_len[bs:].fill_(1)  # expect: FC104
        rows_pages = (bs, int(indptr_np[bs]))
        if self._plan_info.get(bucket) != rows_pages:
            self._plan_info[bucket] = rows_pages
        self.graphs[bucket].replay()
        return self.out_ids[:bs]
