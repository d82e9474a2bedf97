"""CUDA graphs of one critique decode step per batch bucket."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict, List

import torch

if TYPE_CHECKING:
    from rmserve_gpu.critique import CritiqueDecoder

logger = logging.getLogger(__name__)


class CritiqueGraphPool:
    def __init__(self, decoder: "CritiqueDecoder"):
        self.decoder = decoder
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.max_ctx: Dict[int, int] = {}
        self.mempool = torch.cuda.graph_pool_handle()

    def record_all(self) -> None:
        self.check_buckets()
        for bs in sorted(self.decoder.settings.critique_batch_sizes, reverse=True):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        d = self.decoder
        rids: List[str] = [f"__graph_warmup_{i}" for i in range(bs)]
        for rid in rids:
            d.kv_pool.alloc(rid, 1)
        d.plan_decode(bs, rids, rids)
        for _ in range(2):
            d.decode_body(bs)
        torch.cuda.synchronize()  # ok: FC101
        max_ctx = int(d.static_kv_lens[:bs].max())  # expect: FC101
        self.max_ctx[bs] = max_ctx
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            out = d.decode_body(bs)
        self.graphs[bs] = g
        self.outputs[bs] = out
        for rid in rids:
            d.kv_pool.release(rid)

    def replay_bucket(self, bs: int) -> torch.Tensor:
        self.graphs[bs].replay()
        return self.outputs[bs]

    def check_buckets(self) -> None:
        """Refuse to record if a wrapper was built for another batch size than its bucket."""
        for bs, w in self.decoder.graph_wrappers.items():
            fixed = vars(w).get("_fixed_batch_size", bs)  # expect: FC103
            if fixed != bs:
                raise RuntimeError(f"critique wrapper for bucket {bs} was built for batch size {fixed}")
