from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from rpp.worker.runner import ModelRunner

logger = logging.getLogger(__name__)


class DecodeGraphPool:
    """One full CUDA graph per padded decode batch size."""

    def __init__(self, runner: "ModelRunner", capture_sizes: list[int]):
        self.runner = runner
        self.capture_sizes = sorted(capture_sizes)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.mempool = None

    def padded_size(self, num_reqs: int) -> Optional[int]:
        i = bisect.bisect_left(self.capture_sizes, num_reqs)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    def can_replay(self, num_reqs: int) -> bool:
        bs = self.padded_size(num_reqs)
        return bs is not None and bs in self.graphs

    def capture(self, bs: int) -> None:
        r = self.runner
        common = r.make_dummy_decode_metadata(bs)
        meta = r.attn_builder.build_for_cudagraph_capture(common)
        ids, pos = r.input_ids[:bs], r.positions[:bs]
        # eager warm-up: JIT modules load and the allocator settles before recording
        out = r.model.decode_forward(ids, pos, r.kv_caches, meta)
        if not torch.isfinite(out).all():  # expect: FC101
            raise RuntimeError(f"non-finite hidden states in the warm-up of batch size {bs}")
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            out = r.model.decode_forward(ids, pos, r.kv_caches, meta)
        if self.mempool is None:
            self.mempool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def replay(self, num_reqs: int) -> torch.Tensor:
        bs = self.padded_size(num_reqs)
        self.graphs[bs].replay()
        return self.outputs[bs]
