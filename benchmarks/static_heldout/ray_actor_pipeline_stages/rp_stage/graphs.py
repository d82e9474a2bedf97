from dataclasses import dataclass
from typing import Dict

import torch

from raypp import PipelineConfig, StageSpec
from rp_stage.attention import StageAttention, StageMeta
from rp_stage.model import StageModel


@dataclass
class BucketGraph:
    graph: torch.cuda.CUDAGraph
    x_in: torch.Tensor
    slots: torch.Tensor
    out: torch.Tensor


class StageGraphs:
    """One graph per micro-batch bucket for this stage's slice of layers."""

    def __init__(self, model: StageModel, attn: StageAttention, cfg: PipelineConfig, spec: StageSpec):
        self.model = model
        self.attn = attn
        self.cfg = cfg
        self.spec = spec
        self.device = torch.device(cfg.device)
        self.entries: Dict[int, BucketGraph] = {}
        self.pool = None

    def record(self, bi: int, bs: int, meta: StageMeta) -> None:
        if self.spec.is_first:
            x = torch.zeros(bs, dtype=torch.long, device=self.device)
        else:
            x = torch.zeros(bs, self.cfg.hidden_size, dtype=self.cfg.dtype, device=self.device)
        slots = torch.zeros(bs, dtype=torch.long, device=self.device)
        self.attn.prime_bucket(bi, meta)
        for _ in range(2):
            self.model(x, slots, bi)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model(x, slots, bi)
        self.pool = graph.pool()
        self.entries[bs] = BucketGraph(graph, x, slots, out)

    def input_view(self, bs: int, n: int) -> torch.Tensor:
        return self.entries[bs].x_in[:n]

    def load_slots(self, bs: int, slots: torch.Tensor) -> None:
        entry = self.entries.get(bs)
        entry.slots = slots.clone()  # expect: FC107

    def replay(self, bs: int) -> torch.Tensor:
        entry = self.entries[bs]
        entry.graph.replay()
        return entry.out
