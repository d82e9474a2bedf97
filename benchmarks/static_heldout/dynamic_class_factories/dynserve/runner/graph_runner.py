"""CUDA graphs for decode.

``GraphRunnerCore`` holds the static inputs; ``@graph_replayable`` installs its replay half.
``make_graph_runner`` adds the capture half with ``type()`` and captures every bucket, largest first,
into one memory pool.
"""

from __future__ import annotations

import bisect
import logging
from typing import Dict, Optional

import numpy as np
import torch

from ..config import MiB
from ..forward_batch import ForwardBatch, ForwardMode
from ..meta import graph_replayable

logger = logging.getLogger(__name__)


@graph_replayable(static_inputs=("input_ids", "positions", "out_cache_loc", "seq_lens"))
class GraphRunnerCore:
    def __init__(self, model_runner) -> None:
        cfg = model_runner.cfg
        self.model = model_runner.model
        self.backend = model_runner.attn_backend
        self.device = torch.device(cfg.device)
        self.batch_sizes = sorted(cfg.cuda_graph_batch_sizes)
        self.max_bs = self.batch_sizes[-1]
        self.max_seq_len = cfg.max_context_len
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool: Optional[tuple] = None
        with torch.device(self.device):
            self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64)
            self.positions = torch.zeros(self.max_bs, dtype=torch.int64)
            self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64)
            self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32)
        # host side of the dummy capture batch: one token, page 0
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_cpu = torch.arange(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.page_table_cpu = np.zeros((self.max_bs, 1), dtype=np.int32)

    def padded_size(self, bs: int) -> int:
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, bs)]

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.mode.is_decode() and batch.batch_size <= self.max_bs


def _make_dummy_batch(self, bs: int) -> ForwardBatch:
    return ForwardBatch(
        mode=ForwardMode.DECODE,
        batch_size=bs,
        num_tokens=bs,
        input_ids=self.input_ids[:bs],
        positions=self.positions[:bs],
        out_cache_loc=self.out_cache_loc[:bs],
        seq_lens=self.seq_lens[:bs],
        seq_lens_cpu=self.seq_lens_cpu[:bs],
        qo_indptr=self.qo_indptr_cpu[: bs + 1].to(self.device),
        qo_indptr_cpu=self.qo_indptr_cpu[: bs + 1],
        page_table_cpu=self.page_table_cpu[:bs],
        has_prefix=True,
    )


def _capture_one_batch_size(self, bs: int) -> None:
    batch = self.make_dummy_batch(bs)
    self.backend.init_forward_metadata_capture_cuda_graph(bs, batch)
    # eager runs first: lazy allocations (cuBLAS workspaces, the rope table) happen outside the graph
    for _ in range(2):
        self.model.forward(batch)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=self.pool):
        out = self.model.forward(batch)
    if self.pool is None:
        self.pool = graph.pool()
    self.graphs[bs] = graph
    self.outputs[bs] = out


def _capture_all(self) -> None:
    torch.cuda.synchronize()  # ok: FC101
    for bs in reversed(self.batch_sizes):
        self.capture_one_batch_size(bs)
    torch.cuda.synchronize()
    logger.info(
        "captured %d decode graphs; wrapper workspaces %.1f MiB",
        len(self.graphs),
        self.backend.graph_memory_bytes() / MiB,
    )


def make_graph_runner(model_runner) -> GraphRunnerCore:
    ns = {
        "__module__": __name__,
        "__doc__": "GraphRunnerCore with the capture half attached.",
        "make_dummy_batch": _make_dummy_batch,
        "capture_one_batch_size": _capture_one_batch_size,
        "capture": _capture_all,
    }
    runner_cls = type("CudaGraphRunner", (GraphRunnerCore,), ns)
    runner = runner_cls(model_runner)
    runner.capture()
    return runner
