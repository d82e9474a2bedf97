"""Re-runs recorded steps through the same graphs and compares checksums."""

from __future__ import annotations

import math
from typing import List, Optional

import numpy as np
import torch

from dr_attn.backend import ReplayableBackend
from dr_engine.batch import ScheduleOutput
from dr_engine.graphs import BucketGraphs
from steplog import Checksummer, StepRecord


class Mismatch(Exception):
    pass


class StepReplayer:
    def __init__(self, engine):
        self.engine = engine
        self.backend: ReplayableBackend = engine.backend
        self.graphs: BucketGraphs = engine.graphs
        self.checksummer: Checksummer = engine.checksummer
        self.device = engine.device
        self._cached_module = None  # compiled comparison kernel, built on first use

    def _compare_fn(self):
        if self._cached_module is None:  # ok: FC103
            self._cached_module = torch.compile(lambda a, b: (a - b).abs().max())
        return self._cached_module

    def _schedule(self, rec: StepRecord) -> ScheduleOutput:
        if rec.num_prefill:
            raise Mismatch(f"step {rec.step}: only decode steps are re-run")
        tables = np.split(rec.kv_indices, rec.kv_indptr[1:-1])
        return ScheduleOutput(
            token_ids=rec.input_ids,
            positions=rec.positions,
            query_lens=np.ones(rec.batch_size, dtype=np.int32),
            seq_lens=rec.seq_lens,
            page_tables=list(tables),
            num_prefill=0,
        )

    def rerun(self, rec: StepRecord) -> float:
        """Re-run one decode step bit for bit: same bucket, same pages."""
        batch = self.engine.builder.build(self._schedule(rec))
        bucket = self.graphs.bucket_for(rec.batch_size)
        if bucket is None:
            raise Mismatch(f"step {rec.step}: batch {rec.batch_size} has no graph")
        self.backend.init_forward_metadata_replay_cuda_graph(bucket, batch)
        # reproduce the exact page layout of the recorded run
        recorded = torch.from_numpy(rec.kv_indices).to(self.device)
        self.backend.graph_bufs.indices[: recorded.numel()].copy_(recorded)  # expect: FC104
        entry = self.graphs.graphs[bucket]
        entry.graph.replay()
        logits = entry.logits[: rec.batch_size]
        if rec.tokens is not None:
            sampled = torch.argmax(logits, dim=-1).to("cpu")
            if float(self._compare_fn()(sampled, torch.from_numpy(rec.tokens))) != 0:
                raise Mismatch(f"step {rec.step}: sampled tokens differ from the recording")
        got = self.checksummer(logits).cpu()  # ok: FC101
        return float(got)

    def run_log(self, records: List[StepRecord], tol: float = 0.0) -> Optional[int]:
        """Return the first step whose checksum differs, or None."""
        for rec in records:
            if rec.num_prefill or rec.checksum is None:
                continue
            got = self.rerun(rec)
            if not math.isclose(got, rec.checksum, rel_tol=0.0, abs_tol=tol):
                return rec.step
        return None
