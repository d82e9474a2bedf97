"""One CUDA-graph pool per tenant: its own memory pool, static inputs and graphs."""
from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Dict, List, Sequence

import torch

from colo.tenants import StepBatch, TenantSpec

if TYPE_CHECKING:
    from colo.attn.tenant_backend import TenantAttnBackend
    from colo.models.tiny_lm import TinyLM

logger = logging.getLogger(__name__)


class TenantGraphPool:
    def __init__(self, spec: TenantSpec, backend: "TenantAttnBackend", model: "TinyLM", buckets: Sequence[int]):
        assert list(buckets) == sorted(buckets), "graph buckets must be ascending"  # expect: FC109
        self.spec = spec
        self.backend = backend
        self.model = model
        self.buckets: List[int] = list(buckets)
        self._use_cuda_graph = bool(self.buckets)  # ok: FC103
        dev = backend.device
        max_bs = self.buckets[-1] if self.buckets else 1
        self.static_inputs: Dict[str, torch.Tensor] = {
            "input_ids": torch.zeros(max_bs, dtype=torch.int64, device=dev),
            "positions": torch.zeros(max_bs, dtype=torch.int64, device=dev),
            "out_cache_loc": torch.zeros(max_bs, dtype=torch.int64, device=dev),
            "seq_lens": torch.ones(max_bs, dtype=torch.int32, device=dev),
        }
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        # a private memory pool per tenant so one tenant's graphs never alias another's
        self.mempool = torch.cuda.graph_pool_handle()
        self.backend.init_graph_buffers()

    def can_run(self, batch: StepBatch) -> bool:
        return self._use_cuda_graph and bool(self.graphs) and batch.size <= self.buckets[-1]

    def bucket_for(self, raw_bs: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, raw_bs)]

    def capture_tenant(self) -> None:
        for bs in reversed(self.buckets):
            self._capture_bs(bs)

    def _capture_bs(self, bs: int) -> None:
        ids = self.static_inputs["input_ids"][:bs]
        pos = self.static_inputs["positions"][:bs]
        loc = self.static_inputs["out_cache_loc"][:bs]
        seq_lens = self.static_inputs["seq_lens"][:bs]
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        torch.cuda.synchronize()  # ok: FC101
        self.model(ids, pos, loc)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = self.model(ids, pos, loc)
        logger.info(f"captured tenant={self.spec.name} bs={bs} longest={seq_lens.max()}")  # expect: FC101
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def replay(self, batch: StepBatch) -> torch.Tensor:
        raw_bs = batch.size
        bs = self.bucket_for(raw_bs)
        self.static_inputs["input_ids"][:raw_bs].copy_(batch.input_ids)
        self.static_inputs["positions"][:raw_bs].copy_(batch.positions)
        self.static_inputs["out_cache_loc"][:raw_bs].copy_(batch.out_cache_loc)
        self.static_inputs["seq_lens"] = batch.seq_lens.clone()  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
