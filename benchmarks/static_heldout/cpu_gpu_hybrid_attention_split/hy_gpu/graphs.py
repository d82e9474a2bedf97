"""Per-bucket, per-layer CUDA graphs of the GPU part of the decode step."""

from typing import Dict, Tuple

import torch

from hybridattn import HybridConfig

from .model import HybridModel, StepStatics
from .window_backend import WindowBackend


class WindowGraphs:
    def __init__(self, model: HybridModel, backend: WindowBackend, statics: StepStatics, cfg: HybridConfig):
        self.model = model
        self.backend = backend
        self.statics = statics
        self.cfg = cfg
        self.graphs: Dict[Tuple[int, int, str], torch.cuda.CUDAGraph] = {}
        self.pool = None

    def record_bucket(self, bs: int) -> None:
        self.backend.plan_for_capture(bs)
        st = self.statics
        for layer in range(self.cfg.num_layers):
            self.model.run_near(layer, st, bs)
            self.model.run_tail(layer, st, bs)
        torch.cuda.synchronize()  # ok: FC101
        for layer in range(self.cfg.num_layers):
            for half, fn in (("near", self.model.run_near), ("tail", self.model.run_tail)):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    fn(layer, st, bs)
                self.pool = g.pool()
                self.graphs[(bs, layer, half)] = g

    def record_all(self) -> None:
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.record_bucket(bs)
        self.check_buckets()

    def check_buckets(self) -> None:
        for bs, w in self.backend.window_wrappers.items():
            if w._fixed_batch_size != bs:  # expect: FC103
                raise RuntimeError(f"bucket {bs} wrapper was built for another batch size")

    def replay_near(self, bs: int, layer: int) -> None:
        self.graphs[(bs, layer, "near")].replay()

    def replay_tail(self, bs: int, layer: int) -> None:
        self.graphs[(bs, layer, "tail")].replay()
