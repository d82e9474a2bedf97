"""A set of CUDA graphs sharing one memory pool and one workspace."""

import torch

from dualspec.config import SpecConfig
from dualspec.shared_bufs import SharedPageBuffers


class GraphPool:
    name = "base"

    def __init__(self, cfg: SpecConfig, shared: SharedPageBuffers, model, device):
        self.cfg = cfg
        self.shared = shared
        self.model = model
        self.device = device
        self.graphs = {}
        self.outputs = {}
        self.wrappers = {}
        self.mem_pool = None
        self._recorded = False

    def sync_before_capture(self):
        torch.cuda.current_stream().synchronize()  # ok: FC101

    def _keep(self, bs: int, graph, out):
        if self.mem_pool is None:
            self.mem_pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out
        self._recorded = True

    def replay(self, bs: int):
        assert self._recorded, "record() must run before replay()"  # ok: FC109
        self.graphs[bs].replay()
        return self.outputs[bs]
