"""Per-bucket CUDA graphs for decode steps.

Each captured batch size owns one list in ``backend.graph_state`` (``BUF_*``
slots): its bound ``kv_indptr``/``kv_last_page_len``, the shared ``kv_indices``,
the graph-mode wrapper, the graph, its static inputs and its output.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import torch

from .records import pad_host_pairs
from .slots import (
    BATCH_SIZE,
    BUF_GRAPH,
    BUF_INPUT_IDS,
    BUF_LAST_PAGE,
    BUF_OUTPUT,
    BUF_POSITIONS,
    BUF_WRAPPER,
    MODE,
    POSITIONS,
)

if TYPE_CHECKING:
    from .model_runner import ModelRunner

logger = logging.getLogger(__name__)


class BucketGraphRunner:
    def __init__(self, model_runner: "ModelRunner", buckets: list[int]):
        assert buckets and buckets == sorted(buckets), "capture buckets must be ascending"  # expect: FC109
        self.backend = model_runner.attn_backend
        self.model = model_runner.model
        self.device = model_runner.device
        self.buckets = tuple(buckets)
        max_bs = self.buckets[-1]
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.pad_ids = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.pool = None
        self._captured = False

    # ---------------------------------------------------------------- capture

    def capture(self) -> None:
        if not self.backend.graphs_enabled():
            return
        self.backend.init_cuda_graph_state(self.buckets[-1])
        torch.cuda.synchronize()  # ok: FC101
        # largest first, so that the smaller buckets reuse the pool's blocks
        for bs in reversed(self.buckets):
            self.record_bucket(bs)
        torch.cuda.synchronize()
        self._captured = True
        logger.info("captured %d decode buckets up to bs=%d", len(self.buckets), self.buckets[-1])

    def record_bucket(self, bs: int) -> None:
        meta = self.backend.init_forward_metadata_capture_cuda_graph(bs)
        state = self.backend.graph_state[bs]
        if not getattr(state[BUF_WRAPPER], "_use_cuda_graph", False):  # expect: FC103
            raise RuntimeError(f"bucket {bs}: decode wrapper is not in CUDA-graph mode")
        logger.debug(f"bucket {bs}: kv_last_page_len={state[BUF_LAST_PAGE]}")  # expect: FC101
        input_ids = self.input_ids[:bs]
        positions = self.positions[:bs]
        meta = meta[:POSITIONS] + (positions,) + meta[POSITIONS + 1 :]
        for _ in range(2):  # warm-up: lazy module loads and autotuning stay outside the graph
            self.model.decode(input_ids, meta)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.decode(input_ids, meta)
        if self.pool is None:
            self.pool = graph.pool()
        state[BUF_GRAPH] = graph
        state[BUF_INPUT_IDS] = input_ids
        state[BUF_POSITIONS] = positions
        state[BUF_OUTPUT] = out

    # ----------------------------------------------------------------- replay

    def bucket_for(self, bs: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, bs)]

    def can_run(self, meta: tuple) -> bool:
        return self._captured and meta[MODE] == "decode" and meta[BATCH_SIZE] <= self.buckets[-1]

    def replay(self, input_ids: torch.Tensor, meta: tuple) -> torch.Tensor:
        assert self._captured, "replay() before capture()"  # ok: FC109
        bs = meta[BATCH_SIZE]
        pbs = self.bucket_for(bs)
        self.replay_prepare(pbs, input_ids, meta)
        state = self.backend.graph_state[pbs]
        state[BUF_GRAPH].replay()
        return state[BUF_OUTPUT][:bs]

    def replay_prepare(self, pbs: int, input_ids: torch.Tensor, meta: tuple) -> None:
        bs = meta[BATCH_SIZE]
        state = self.backend.graph_state[pbs]
        self.backend.refresh_bucket(pbs, pad_host_pairs(meta, pbs))
        positions = meta[POSITIONS]
        if pbs > bs:
            pad = self.pad_ids[: pbs - bs]
            input_ids = torch.cat([input_ids, pad])  # ok: FC107
            positions = torch.cat([positions, pad])
        state[BUF_INPUT_IDS].copy_(input_ids)  # ok: FC104
        state[BUF_POSITIONS] = positions.clone()  # expect: FC107

    def dump_buckets(self) -> list[tuple]:
        """(bs, plan record) for every captured bucket, for the debug endpoint."""
        return [(bs, self.backend.trace_bucket(bs)) for bs in self.buckets]
