"""Decode graphs per bucket covering every layer group."""
from __future__ import annotations

import bisect
from typing import Dict, List, Tuple

import numpy as np
import torch

from lg_runtime.metadata import GlobalStepMetadata, GroupBatch, GroupStepMetadata, StepMetadata
from lg_runtime.model import GroupedModel
from lg_runtime.planner import LayerGroupPlanner
from lgroups.spec import ModelGroupsConfig


class GroupGraphEntry:
    """A recorded bucket and the plan it was recorded against."""

    def __init__(self, graph: torch.cuda.CUDAGraph, output: torch.Tensor, plan_signature: Tuple[int, ...]):
        self.graph = graph
        self.output = output
        self._plan_info = plan_signature

    def matches(self, bs: int) -> bool:
        return self._plan_info[0] == bs  # ok: FC103


class GroupGraphRunner:
    def __init__(self, model: GroupedModel, planner: LayerGroupPlanner, cfg: ModelGroupsConfig, device: torch.device):
        self.model = model
        self.planner = planner
        self.cfg = cfg
        self.device = device
        self.sizes = sorted(cfg.graph_bs)
        self.max_bs = self.sizes[-1]
        self.static_inputs: Dict[str, torch.Tensor] = {
            "input_ids": torch.zeros(self.max_bs, dtype=torch.int64, device=device),
            "positions": torch.zeros(self.max_bs, dtype=torch.int64, device=device),
        }
        self.entries: Dict[int, GroupGraphEntry] = {}
        self.max_graph_pages: Dict[int, int] = {}
        self.pool = None

    def bucket(self, n: int) -> int:
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def _dummy_batch(self, bs: int) -> GroupBatch:
        dev = self.device
        specs = self.planner.specs
        return GroupBatch(
            num_reqs=bs,
            num_tokens=bs,
            is_decode=True,
            input_ids=self.static_inputs["input_ids"][:bs],
            positions=self.static_inputs["positions"][:bs],
            q_lens=torch.ones(bs, dtype=torch.int64, device=dev),
            qo_indptr=torch.arange(bs + 1, dtype=torch.int32, device=dev),
            qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            seq_lens=torch.ones(bs, dtype=torch.int32, device=dev),
            seq_lens_np=np.ones(bs, dtype=np.int64),
            req_pages={g: [np.zeros(1, dtype=np.int32)] * bs for g in range(len(specs))},
            block_tables={g: torch.zeros((bs, 1), dtype=torch.int32, device=dev) for g in range(len(specs))},
        )

    def _graph_meta(self, bs: int, planned: StepMetadata) -> StepMetadata:
        p = self.planner
        meta = StepMetadata(num_reqs=bs)
        for g in p.local_ids:
            meta.groups[g] = GroupStepMetadata(
                wrapper=p.graph_wrappers[g][bs],
                slot_mapping=p.graph_slot_mapping[g][:bs],
                nnz_pages=planned.groups[g].nnz_pages,
            )
        gid = p.global_id
        meta.global_meta = GlobalStepMetadata(wrapper=p.global_decode, slot_mapping=p.graph_slot_mapping[gid][:bs])
        return meta

    def record(self, bs: int) -> None:
        p = self.planner
        p.init_graph_wrappers(bs)
        batch = self._dummy_batch(bs)
        planned = p.plan_step(batch, graph_bs=bs)
        for g in p.local_ids:
            self.max_graph_pages[g] = p.graph_bufs[g].kv_indptr[bs].item()  # expect: FC101
        meta = self._graph_meta(bs, planned)
        ids, pos = batch.input_ids, batch.positions
        for _ in range(2):
            self.model(ids, pos, meta)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model(ids, pos, meta)
        self.pool = graph.pool()
        self.entries[bs] = GroupGraphEntry(graph, out, (bs,) + tuple(planned.groups[g].nnz_pages for g in p.local_ids))

    def record_all(self) -> None:
        for bs in reversed(self.sizes):
            self.record(bs)

    def _load_inputs(self, batch: GroupBatch) -> None:
        for key, src in (("input_ids", batch.input_ids), ("positions", batch.positions)):
            dst = self.static_inputs[key]
            if dst.shape[0] < src.shape[0]:
                self.static_inputs[key] = torch.empty_like(src)  # expect: FC107
                dst = self.static_inputs[key]
            dst[: src.shape[0]].copy_(src)

    def replay(self, batch: GroupBatch) -> torch.Tensor:
        bs = self.bucket(batch.num_reqs)
        self._load_inputs(batch)
        self.planner.prepare_replay(batch, bs)
        entry = self.entries[bs]
        if not entry.matches(bs):
            raise RuntimeError(f"bucket {bs} was recorded for another plan")
        entry.graph.replay()
        return entry.output[: batch.num_reqs]

    def replay_same_plan(self, batch: GroupBatch) -> torch.Tensor:
        """Replay again on the previous plan (no request crossed a page this step)."""
        bs = self.bucket(batch.num_reqs)
        self._load_inputs(batch)
        entry = self.entries[bs]
        entry.graph.replay()
        return entry.output[: batch.num_reqs]

    def replay_debug_dump(self, bs: int) -> Dict[int, List[int]]:
        """Operator endpoint: the page lists a bucket would read right now."""
        bufs = self.planner.graph_bufs
        return {g: bufs[g].kv_indptr[: bs + 1].cpu().tolist() for g in self.planner.local_ids}  # ok: FC101
