"""One CUDA graph per decode bucket; the captured step includes the device page pops."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import torch

from drsched.config import SchedConfig
from drsched_rt.attention import ResidentAttnBackend
from drsched_rt.model import ResidentModel
from drsched_rt.scheduler import StepPlan


@dataclasses.dataclass
class BucketGraph:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor


class BucketGraphRunner:
    def __init__(self, model: ResidentModel, backend: ResidentAttnBackend, cfg: SchedConfig, device: torch.device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.max_bs = cfg.max_graph_bs
        self.static_input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, BucketGraph] = {}
        self.pool: Optional[tuple] = None
        self.backend.init_graph_buffers()

    def capture_all(self) -> None:
        # warm-up steps pop pages for the dummy rows; give them back afterwards
        saved_top = self.backend.freelist.top.clone()
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.capture_bucket(bs)
        # (the bound last-page lengths the warm-up advanced are rewritten by the next plan)
        self.backend.freelist.top.copy_(saved_top)
        self._verify_bucket_wrappers()

    def capture_bucket(self, bs: int) -> None:
        input_ids = self.static_input_ids[:bs]
        positions = self.static_positions[:bs]
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        for _ in range(2):
            self.model.forward_decode(input_ids, positions, bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self.model.forward_decode(input_ids, positions, bs)
        self.pool = g.pool()
        self.graphs[bs] = BucketGraph(graph=g, input_ids=input_ids, positions=positions, logits=logits)

    def _verify_bucket_wrappers(self) -> None:
        for bs, w in self.backend.graph_wrappers.items():
            if w._fixed_batch_size != bs:  # expect: FC103
                raise RuntimeError(f"bucket {bs} was captured with a wrapper fixed to another batch size")

    def replay(self, plan: StepPlan, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        bs = plan.bucket
        n = plan.num_decode
        g = self.graphs[bs]
        g.input_ids[:n].copy_(input_ids, non_blocking=True)
        # live rows get their positions, padded rows keep the capture-time ones
        g.positions = torch.cat([positions, g.positions[n:]])  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, plan)
        g.graph.replay()
        return g.logits[:n]
