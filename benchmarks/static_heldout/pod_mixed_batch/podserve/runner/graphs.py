"""CUDA graphs: one per decode batch-size bucket, and one per common (prefill chunk, decode batch) shape."""

from __future__ import annotations

import bisect
import logging
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from podserve.attn.pod_backend import PodAttnBackend
from podserve.config import GRAPH_WARMUP_ITERS, PodConfig
from podserve.model import PodDecoder
from podserve.scheduler import Request, StepPlan

logger = logging.getLogger(__name__)


class DecodeGraphRunner:
    def __init__(self, model: PodDecoder, backend: PodAttnBackend, cfg: PodConfig):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.buckets: List[int] = sorted(cfg.graph_buckets)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.static_input_ids = torch.zeros(cfg.max_graph_bs, dtype=torch.int64, device=backend.device)
        self.static_positions = torch.zeros(cfg.max_graph_bs, dtype=torch.int64, device=backend.device)
        self.pool = None

    def pick_bucket(self, bs: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, bs)]

    def record_bucket(self, bs: int) -> None:
        meta = self.backend.warm_decode_plan(bs)
        ids, pos = self.static_input_ids[:bs], self.static_positions[:bs]
        for _ in range(GRAPH_WARMUP_ITERS):
            self.model.forward_decode(ids, pos, meta)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.forward_decode(ids, pos, meta)
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def record_all(self) -> None:
        # largest first, so that smaller graphs reuse its memory pool
        for bs in reversed(self.buckets):
            self.record_bucket(bs)

    def replay(self, plan: StepPlan, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        bs = plan.num_decodes
        padded = self.pick_bucket(bs)
        self.backend.prepare_decode_replay(bs, padded, plan)
        self.static_input_ids[:bs].copy_(input_ids, non_blocking=True)
        self.static_positions[:bs].copy_(positions, non_blocking=True)
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]


class MixedGraphRunner:
    """Captures POD steps for the (chunk, decodes) shapes the scheduler produces most often."""

    def __init__(self, model: PodDecoder, backend: PodAttnBackend, cfg: PodConfig):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.graphs: Dict[Tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[Tuple[int, int], torch.Tensor] = {}
        self.static_input_ids = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=backend.device)

    def _dummy_plan(self, chunk: int, bs: int) -> StepPlan:
        prefill = Request(-1, [0] * chunk, 1, pages=list(range(-(-chunk // self.cfg.page_size))))
        decodes = [Request(-2 - i, [0], 1, pages=[0], num_computed=1) for i in range(bs)]
        two = np.full(bs, 2, dtype=np.int32)
        return StepPlan(prefill, 0, chunk, decodes, np.arange(bs + 1, dtype=np.int32), np.zeros(bs, np.int32), two, two)

    def record_shape(self, chunk: int, bs: int) -> None:
        plan = self._dummy_plan(chunk, bs)
        meta = self.backend.prepare_mixed(plan, graph_shape=(chunk, bs))
        ids = self.static_input_ids[: chunk + bs]
        self.model.forward_mixed(ids, self.backend.mixed_positions, meta)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.model.forward_mixed(ids, self.backend.mixed_positions, meta)
        logger.info(f"captured mixed graph chunk={chunk} decodes={bs} kv_indptr={meta.kv_indptr_gpu}")  # expect: FC101
        self.graphs[(chunk, bs)] = graph
        self.outputs[(chunk, bs)] = logits

    def replay(self, plan: StepPlan, input_ids: torch.Tensor) -> Optional[torch.Tensor]:
        key = (plan.chunk_len, plan.num_decodes)
        graph = self.graphs.get(key)
        if graph is None:
            return None
        self.backend.prepare_mixed(plan, graph_shape=key)
        self.static_input_ids[: plan.num_tokens].copy_(input_ids, non_blocking=True)
        graph.replay()
        return self.outputs[key]
