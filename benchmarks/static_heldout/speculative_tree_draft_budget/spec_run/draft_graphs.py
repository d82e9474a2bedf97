"""CUDA graphs for the draft steps: one root-extend graph and one step graph per row bucket."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from spec_attn.draft_backend import DraftDecodeBackend, RootTable, dummy_root_table
from spec_run.models import DraftModel
from treespec.config import SpecConfig
from treespec.tree import RowPageTable

logger = logging.getLogger(__name__)


@dataclass
class StepInputs:
    n: int  # rows (root extend: requests, two queries each)
    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor


class DraftGraphRunner:
    def __init__(self, cfg: SpecConfig, model: DraftModel, backend: DraftDecodeBackend, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.device = device
        width = 2 * cfg.max_draft_rows
        self.static_inputs: Dict[str, torch.Tensor] = {
            "tokens": torch.zeros(width, dtype=torch.int64, device=device),
            "positions": torch.zeros(width, dtype=torch.int64, device=device),
            "slots": torch.zeros(width, dtype=torch.int64, device=device),
        }
        self._pad_positions = torch.zeros(width, dtype=torch.int64, device=device)
        self.graphs: Dict[Tuple[str, int], torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[Tuple[str, int], torch.Tensor] = {}
        self.buckets: List[int] = sorted(cfg.draft_buckets)
        self.pool = None

    def bucket_for(self, n: int) -> Optional[int]:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def _body(self, kind: str, rows: int) -> torch.Tensor:
        si = self.static_inputs
        if kind == "root":
            w = 2 * rows
            return self.model.extend_root(si["tokens"][:w], si["positions"][:w], si["slots"][:w], rows)
        return self.model.draft_step(si["tokens"][:rows], si["positions"][:rows], si["slots"][:rows], rows)

    def capture_draft_graphs(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        self.pool = torch.cuda.graph_pool_handle()
        for rows in reversed(self.buckets):
            self._record("step", rows)
            if rows <= self.cfg.max_batch:
                self._record("root", rows)
        torch.cuda.synchronize()
        logger.info("captured %d draft graphs", len(self.graphs))

    def _record(self, kind: str, rows: int) -> None:
        if kind == "root":
            self.backend.plan_root(dummy_root_table(rows))
        else:
            self.backend.replay_prepare(rows, RowPageTable.dummy(rows))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._body(kind, rows)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.outputs[(kind, rows)] = self._body(kind, rows)
        self.graphs[(kind, rows)] = g
        if kind == "step" and not self.backend.is_planned(rows):
            raise RuntimeError(f"draft bucket {rows} was captured without a plan")

    def replay(self, kind: str, inputs: StepInputs) -> torch.Tensor:
        n = inputs.n
        width = 2 * n if kind == "root" else n
        bucket = self.bucket_for(n)
        si = self.static_inputs
        si["tokens"][:width].copy_(inputs.tokens)
        # consecutive steps of one depth usually write the same slots: skip the copy then
        if not torch.equal(si["slots"][:width], inputs.slots):  # expect: FC101
            si["slots"][:width].copy_(inputs.slots)
        # padded rows keep position 0 so the rope table is never indexed out of range
        self.static_inputs["positions"] = torch.cat([inputs.positions, self._pad_positions[width:]])  # expect: FC107
        self.graphs[(kind, bucket)].replay()
        return self.outputs[(kind, bucket)][:n]

    def run_step(self, inputs: StepInputs, table: RowPageTable) -> torch.Tensor:
        bucket = self.bucket_for(inputs.n)
        if bucket is None or ("step", bucket) not in self.graphs:
            self.backend.plan_eager(table)
            return self.model.draft_step(inputs.tokens, inputs.positions, inputs.slots, inputs.n)
        self.backend.replay_prepare(bucket, table)
        return self.replay("step", inputs)

    def run_root(self, inputs: StepInputs, table: RootTable) -> torch.Tensor:
        self.backend.plan_root(table)
        bucket = self.bucket_for(inputs.n)
        if bucket is None or ("root", bucket) not in self.graphs:
            return self.model.extend_root(inputs.tokens, inputs.positions, inputs.slots, inputs.n)
        return self.replay("root", inputs)
