from typing import Dict

import numpy as np
import torch

from plp.config import LogprobConfig
from plp_exec.backend import ChunkedAttentionBackend
from plp_exec.model import ChunkedLM


class DecodeGraphRunner:
    def __init__(self, model: ChunkedLM, backend: ChunkedAttentionBackend, cfg: LogprobConfig, device: torch.device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        mb = max(cfg.decode_buckets)
        self.static_ids = torch.zeros(mb, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def capture_decode_graphs(self) -> None:
        for bs in sorted(self.cfg.decode_buckets, reverse=True):
            self.backend.init_forward_metadata_capture_cuda_graph(bs)
            ids = self.static_ids[:bs]
            self.model.forward_decode(ids, bs)
            torch.cuda.synchronize()  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                self.outputs[bs] = self.model.forward_decode(ids, bs)
            if self.pool is None:
                self.pool = g.pool()
            self.graphs[bs] = g

    def replay(
        self, bs: int, real_bs: int, input_ids: torch.Tensor, seq_lens_np: np.ndarray, page_table_np: np.ndarray
    ) -> torch.Tensor:
        self.static_ids[:real_bs].copy_(input_ids)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, real_bs, seq_lens_np, page_table_np)
        self.graphs[bs].replay()
        return self.outputs[bs][:real_bs]
