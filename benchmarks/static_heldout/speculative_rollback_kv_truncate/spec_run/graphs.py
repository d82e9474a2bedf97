"""Draft, target and verify graphs per bucket."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import torch

from spec_attn.backend import SpecAttnBackend
from spec_run.model import SpecLM
from specroll.config import SpecConfig


@dataclasses.dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    pad_ids: torch.Tensor
    logits: torch.Tensor


class SpecGraphRunner:
    def __init__(self, cfg: SpecConfig, backend: SpecAttnBackend, draft_model: SpecLM,
                 target_model: SpecLM, verifier: SpecLM, draft_kv: torch.Tensor,
                 target_kv: torch.Tensor, device: torch.device):
        self.cfg = cfg
        self.backend = backend
        self.draft_model = draft_model
        self.target_model = target_model
        self.verifier = verifier
        self.draft_kv = draft_kv
        self.target_kv = target_kv
        self.device = device
        self.draft_graphs: Dict[int, GraphEntry] = {}
        self.target_graphs: Dict[int, GraphEntry] = {}
        self.verify_graphs: Dict[int, GraphEntry] = {}
        self.mempool: Optional[tuple] = None

    def bucket_for(self, bs: int) -> Optional[int]:
        return next((b for b in self.cfg.buckets if b >= bs), None)

    def record_graphs(self) -> None:
        torch.cuda.synchronize(self.device)  # ok: FC101
        k1 = self.cfg.num_draft_tokens + 1
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.backend.plan_for_capture(bs)
            self.draft_graphs[bs] = self._record(self.draft_model, self.draft_kv, bs, bs)
            self.target_graphs[bs] = self._record(self.target_model, self.target_kv, bs, bs)
            self.verify_graphs[bs] = self._record(self.verifier, self.target_kv, bs, bs * k1)

    def _record(self, model: SpecLM, kv: torch.Tensor, bs: int, num_tokens: int) -> GraphEntry:
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        pos = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        pad = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        model(ids, pos, kv, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            logits = model(ids, pos, kv, bs)
        if self.mempool is None:
            self.mempool = g.pool()
        return GraphEntry(graph=g, input_ids=ids, positions=pos, pad_ids=pad, logits=logits)

    def _run(self, e: GraphEntry, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        n = ids.shape[0]
        e.input_ids[:n].copy_(ids)
        e.positions[:n].copy_(positions)
        e.graph.replay()
        return e.logits[:n]

    def replay_draft(self, bs: int, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._run(self.draft_graphs[bs], ids, positions)

    def replay_target(self, bs: int, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._run(self.target_graphs[bs], ids, positions)

    def replay_verify(self, bs: int, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        e = self.verify_graphs[bs]
        n = ids.shape[0]
        e.input_ids = torch.cat([ids, e.pad_ids[n:]])  # expect: FC107
        e.positions[:n].copy_(positions)
        e.graph.replay()
        return e.logits[:n]

    def replay_trace(self, bs: int) -> dict:
        # dumped by the offline trace tool after a run
        e = self.verify_graphs[bs]
        return {"ids": e.input_ids.cpu(), "logits": e.logits.float().cpu()}  # ok: FC101
