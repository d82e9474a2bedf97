"""Decode CUDA-graph runner: records one graph per batch size, copies live records into static inputs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Dict, List, Optional

import torch

from prm_engine.records import ForwardBatch, ForwardMode, SamplingRecord, StaticInputs

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


class CudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.backend = model_runner.attn_backend
        cfg = model_runner.cfg
        self.device = torch.device(cfg.device)
        self.capture_bs: List[int] = sorted(cfg.graph_bs)
        self.max_bs = self.capture_bs[-1]
        self.max_graph_seq_len = cfg.max_graph_seq_len
        self.static = StaticInputs.allocate(self.max_bs, self.device)
        self.static_sampling = SamplingRecord.empty(self.max_bs, self.device)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.graphs: Dict[int, GraphEntry] = {}
        self.pool = None
        self.logits_buf: Optional[torch.Tensor] = None
        self.backend.init_cuda_graph_state(self.max_bs)

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    def _pad_bs(self, n: int) -> int:
        for bs in self.capture_bs:
            if bs >= n:
                return bs
        raise ValueError(f"batch of {n} exceeds the largest captured size {self.max_bs}")

    # ------------------------------------------------------------------ capture
    def warm_and_record(self) -> None:
        for bs in reversed(self.capture_bs):
            torch.cuda.synchronize()  # ok: FC101
            self._record_one(bs)
        torch.cuda.synchronize()

    def _capture_batch(self, bs: int) -> ForwardBatch:
        s = self.static
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=s.input_ids[:bs],
            positions=s.positions[:bs],
            seq_lens=s.seq_lens[:bs],
            req_pool_indices=s.req_pool_indices[:bs],
            out_cache_loc=s.out_cache_loc[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            sampling=self.static_sampling,
            use_graph=True,
        )

    def _record_one(self, bs: int) -> None:
        assert bs not in self.graphs  # ok: FC109
        fb = self._capture_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        model = self.model_runner.model
        for _ in range(2):
            model(fb)
        if self.logits_buf is None:
            self.logits_buf = torch.empty(self.max_bs, self.model_runner.cfg.vocab_size, device=self.device)  # ok: FC107
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = model(fb)
        self.pool = g.pool()
        logger.info(f"recorded decode graph bs={bs} seq_lens={fb.seq_lens}")  # expect: FC101
        self.graphs[bs] = GraphEntry(graph=g, logits=logits)

    # ------------------------------------------------------------------ replay
    def stage_record(self, fb: ForwardBatch, bs: int) -> None:
        n = fb.batch_size
        # copy the live record into the static inputs, field by field
        for f in fields(self.static):
            dst = getattr(self.static, f.name)
            dst[:n].copy_(getattr(fb, f.name), non_blocking=True)
        if bs != n:
            self.static.seq_lens[n:bs].fill_(1)  # ok: FC104
        for f in fields(SamplingRecord):
            if f.metadata.get("host"):
                continue
            setattr(self.static_sampling, f.name, getattr(fb.sampling, f.name).clone())  # expect: FC107
        self.seq_lens_cpu[:n].copy_(fb.seq_lens_cpu)
        self.seq_lens_cpu[n:bs].fill_(1)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, self.seq_lens_cpu, self.static.req_pool_indices[:bs])
        # padded rows attend to one slot of the dummy page
        self.backend.kv_last_page_len[n:bs].fill_(1)  # expect: FC104

    def run_graph(self, fb: ForwardBatch) -> torch.Tensor:
        if not self.graphs:
            raise RuntimeError("warm_and_record() has not run")
        if fb.seq_lens.max().item() > self.max_graph_seq_len:  # expect: FC101
            return self.model_runner.forward_eager(fb)
        bs = self._pad_bs(fb.batch_size)
        self.stage_record(fb, bs)
        entry = self.graphs[bs]
        entry.graph.replay()
        return entry.logits[: fb.batch_size]
