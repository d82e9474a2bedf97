"""CUDA only: one decode graph per padded batch size over the FlashInfer backend's graph wrappers."""
import bisect

import torch

from xpuserve.platforms.base import StepInput
from xpuserve.platforms.cuda_flashinfer import CudaFlashInferBackend


class GraphRunner:
    def __init__(self, backend: CudaFlashInferBackend, cfg):
        self.backend = backend
        self.num_layers = cfg.num_layers
        self.bs_list = sorted(cfg.cuda_graph_sizes)
        max_bs = self.bs_list[-1]
        self.static_q = torch.zeros((max_bs, cfg.num_qo_heads, cfg.head_dim), dtype=backend.dtype, device=backend.device)
        self.static_out = {}
        self.graphs = {}
        backend.init_graph_wrappers(self.bs_list)

    def _body(self, bs: int) -> torch.Tensor:
        h = self.static_q[:bs]
        for layer_id in range(self.num_layers):
            h = h + self.backend.forward_graph_decode(h, layer_id, bs)
        return h

    def warmup_and_record(self):
        assert self.backend.kv_indices.numel() >= self.backend.max_blocks  # ok: FC109
        if self.backend._kv_layout != "NHD":  # ok: FC103
            raise NotImplementedError("graph capture supports the NHD cache layout only")
        pool = None
        for bs in reversed(self.bs_list):
            self.backend._plan_graph(bs, bs)
            self._body(bs)
            torch.cuda.synchronize()  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.static_out[bs] = self._body(bs)
            pool = g.pool()
            self.graphs[bs] = g
        # the dummy plans above pointed every row at block 0; clear them before serving
        self.backend.kv_indices.zero_()  # expect: FC104

    def padded_size(self, n: int) -> int:
        return self.bs_list[bisect.bisect_left(self.bs_list, n)]

    def replay(self, batch: StepInput, q: torch.Tensor) -> torch.Tensor:
        n = batch.num_reqs
        bs = self.padded_size(n)
        self.static_q[:n].copy_(q)
        self.backend.prepare_graph_inputs(batch, bs)
        self.graphs[bs].replay()
        return self.static_out[bs][:n]
