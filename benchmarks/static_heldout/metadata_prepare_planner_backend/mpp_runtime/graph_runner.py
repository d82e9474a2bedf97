from typing import Dict, Optional

import numpy as np
import torch

from mpp import BackendConfig, ForwardInput, last_page_lens
from mpp_runtime.model import DecodeBackend, DecodeModel


class GraphRunner:
    def __init__(self, cfg: BackendConfig, model: DecodeModel, backend: DecodeBackend, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.device = device
        max_bs = max(cfg.graph_buckets)
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_out: Dict[int, torch.Tensor] = {}
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None

    def bucket_for(self, bs: int) -> Optional[int]:
        return next((b for b in self.cfg.graph_buckets if b >= bs and b in self.graphs), None)

    def _dummy_input(self, bs: int) -> ForwardInput:
        dev = self.device
        lens = torch.ones(bs, dtype=torch.int32).pin_memory()
        return ForwardInput(
            input_ids=self.static_ids[:bs],
            positions=torch.zeros(bs, dtype=torch.int64, device=dev),
            seq_lens=torch.ones(bs, dtype=torch.int32, device=dev),
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=dev),
            block_table=torch.zeros(bs, 1, dtype=torch.int32, device=dev),
            out_cache_loc=torch.zeros(bs, dtype=torch.int64, device=dev),
            seq_lens_stage=lens,
            kv_indptr_stage=torch.from_numpy(np.arange(bs + 1, dtype=np.int32)).pin_memory(),
            qo_indptr_stage=torch.arange(bs + 1, dtype=torch.int32).pin_memory(),
            last_page_len_stage=last_page_lens(lens, self.cfg.page_size),
        )

    def capture_decode(self, bs: int) -> None:
        self.backend.prepare_metadata_for_replay(self._dummy_input(bs), bs)
        for _ in range(2):
            self.model.forward_decode(self.static_ids[:bs], bs)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.static_out[bs] = self.model.forward_decode(self.static_ids[:bs], bs)
        self.pool = graph.pool()
        self.graphs[bs] = graph

    def capture_all(self) -> None:
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.capture_decode(bs)

    def replay(self, fwd: ForwardInput, bucket: int) -> torch.Tensor:
        bs = fwd.batch_size
        self.static_ids[:bs].copy_(fwd.input_ids)
        self.backend.prepare_metadata_for_replay(fwd, bucket)
        self.graphs[bucket].replay()
        return self.static_out[bucket][:bs]
