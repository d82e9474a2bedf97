"""CUDA graphs per batch size; the ReplayState hands each decode step to ``replay``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from sso.config import BatchKind
from sso.forward_batch import ForwardBatch, pinned_from_numpy

if TYPE_CHECKING:
    from sso.model_runner import GPUModelRunner

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    output: torch.Tensor
    batch_size: int
    kind: BatchKind


class CUDAGraphManager:
    def __init__(self, runner: "GPUModelRunner") -> None:
        self.runner = runner
        cfg = runner.cfg
        dev = runner.device
        self.max_bs = cfg.max_graph_bs
        self.graphs: dict[int, GraphEntry] = {}
        self.static_input_ids = torch.zeros(cfg.max_num_seqs, dtype=torch.int64, device=dev)
        self.static_positions = torch.zeros(cfg.max_num_seqs, dtype=torch.int64, device=dev)
        self.static_seq_lens = torch.ones(cfg.max_num_seqs, dtype=torch.int32, device=dev)
        self.positions_host = torch.zeros(cfg.max_num_seqs, dtype=torch.int64, pin_memory=True)
        self.static_hidden: Optional[torch.Tensor] = None
        self.static_outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def padded_size(self, bs: int) -> int:
        for size in self.runner.cfg.cuda_graph_sizes:
            if size >= bs:
                return size
        raise ValueError(f"batch {bs} exceeds the largest captured size {self.max_bs}")

    # ------------------------------------------------------------------ capture
    def capture_all(self) -> None:
        self.runner.backend.init_cuda_graph_state(self.runner.cfg.cuda_graph_sizes)
        for bs in reversed(self.runner.cfg.cuda_graph_sizes):
            for kind in self.runner.registry.kinds():
                self.capture_one_batch_size(bs, kind)

    def _capture_batch(self, bs: int, kind: BatchKind) -> ForwardBatch:
        import numpy as np

        dev = self.runner.device
        page = self.runner.cfg.page_size
        indptr = np.arange(bs + 1, dtype=np.int32)
        return ForwardBatch(
            kind=kind,
            batch_size=bs,
            num_real_seqs=bs,
            num_prefills=0,
            num_tokens=bs,
            req_ids=[f"capture-{i}" for i in range(bs)],
            input_ids=self.static_input_ids[:bs],
            positions=self.static_positions[:bs],
            seq_lens=self.static_seq_lens[:bs],
            qo_indptr=torch.arange(bs + 1, dtype=torch.int32, device=dev),
            kv_indices=self.runner.backend.cuda_graph_kv_indices,
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            qo_indptr_cpu=pinned_from_numpy(indptr),
            kv_indptr_cpu=pinned_from_numpy(indptr),
            kv_last_page_len_cpu=torch.full((bs,), page, dtype=torch.int32),
            use_graph=True,
        )

    def capture_one_batch_size(self, bs: int, kind: BatchKind) -> None:
        runner = self.runner
        fb = self._capture_batch(bs, kind)
        runner.strategy = runner.registry.for_capture(kind)
        runner.strategy.plan(fb)
        num_pages = int(runner.backend.cuda_graph_kv_indptr[bs])  # expect: FC101
        logger.debug("capture bs=%d kind=%s pages=%d", bs, kind.value, num_pages)
        self.static_outputs[bs] = torch.empty(  # ok: FC107
            bs, runner.cfg.hidden_size, dtype=torch.bfloat16, device=runner.device
        )
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = runner.model(fb.input_ids, fb.positions, fb)
            self.static_outputs[bs].copy_(out)
        self.pool = g.pool()
        self.graphs[bs] = GraphEntry(graph=g, output=self.static_outputs[bs], batch_size=bs, kind=kind)

    # ------------------------------------------------------------------ replay
    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        bs = batch.batch_size
        n = batch.num_tokens
        if self.static_input_ids.numel() < n:
            self.static_input_ids = torch.zeros(n, dtype=torch.int64, device=self.runner.device)  # expect: FC107
        if self.static_hidden is None:
            self.static_hidden = torch.zeros(  # ok: FC107
                self.runner.cfg.max_num_seqs, self.runner.cfg.hidden_size, device=self.runner.device
            )
        if self.positions_host.numel() < n:
            self.positions_host = torch.zeros(n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.static_seq_lens.resize_(bs)  # expect: FC107
        self.static_input_ids[:bs].copy_(batch.input_ids, non_blocking=True)
        self.static_seq_lens[:bs].copy_(batch.seq_lens, non_blocking=True)
        entry = self.graphs[bs]
        entry.graph.replay()
        return entry.output[: batch.num_real_seqs]

    def debug_dump(self) -> dict:
        """Operator tool, not called by the engine."""
        return {bs: e.output.float().cpu() for bs, e in self.graphs.items()}  # ok: FC101

    def evict(self, bs: int) -> None:
        assert len(self.graphs) > 0  # ok: FC109
        self.graphs.pop(bs, None)
