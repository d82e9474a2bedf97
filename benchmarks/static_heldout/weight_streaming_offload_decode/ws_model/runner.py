"""Decode graphs per bucket over the resident layers; streamed layers run eagerly after the replay."""

from typing import Dict, List, Optional

import torch

from wstream import DeviceLayerLRU, LayerWeights, StreamConfig
from ws_attn.backend import DecodeBatch, OffloadAttentionBackend
from ws_model.layers import StreamedLM


class OffloadGraphRunner:
    def __init__(self, cfg: StreamConfig, model: StreamedLM, backend: OffloadAttentionBackend, lru: DeviceLayerLRU,
                 device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.lru = lru
        self.buckets = tuple(sorted(cfg.buckets))
        self.static_ids = torch.zeros(self.buckets[-1], dtype=torch.long, device=device)
        self.resident_weights: List[LayerWeights] = []
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def bind_resident(self) -> None:
        self.resident_weights = [
            self.lru.view(int(self.lru.slot_of_np[i])) for i in range(self.cfg.resident_layers)
        ]

    def bucket_for(self, n: int) -> Optional[int]:
        return next((b for b in self.buckets if b >= n), None)

    def _forward_resident(self, bs: int) -> torch.Tensor:
        h = self.model.embed(self.static_ids[:bs])
        for i in range(self.cfg.resident_layers):
            h = self.model.layers[i](h, self.resident_weights[i], self.model.kv_caches[i], bs)
        return h

    def record_resident(self) -> None:
        for bs in reversed(self.buckets):
            w = self.backend.graph_wrappers[bs]
            if not w.is_cuda_graph_enabled:  # ok: FC103
                raise RuntimeError(f"bucket {bs}: decode wrapper is not in graph mode")
            self.backend.plan_capture(bs)
            if w.__dict__.get("_cached_module") is None:  # expect: FC103
                self._forward_resident(bs)  # JIT-compile outside the capture
            torch.cuda.synchronize()  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                self.outputs[bs] = self._forward_resident(bs)
            self.pool = g.pool()
            self.graphs[bs] = g

    def replay(self, bs: int, batch: DecodeBatch) -> Optional[torch.Tensor]:
        n = batch.batch_size
        evicted = torch.nonzero(~self.lru.resident_dev[: self.cfg.resident_layers])  # expect: FC101
        if evicted.numel() > 0:
            return None
        self.backend.kv_last_page_len[n:bs].fill_(1)  # ok: FC104
        self.backend.plan_bucket(bs, batch)
        self.backend.kv_indptr[n + 1 : bs + 1] = batch.num_pages  # expect: FC104
        self.static_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
