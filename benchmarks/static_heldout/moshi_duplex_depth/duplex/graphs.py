"""One CUDA graph per session bucket covering a whole frame: temporal step plus the depth loop."""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Dict, Tuple

import numpy as np
import torch

if TYPE_CHECKING:
    from duplex.server import DuplexServer, FrameInputs

logger = logging.getLogger(__name__)


class DuplexGraphs:
    def __init__(self, server: "DuplexServer"):
        s = server.settings
        self.settings = s
        self.model = server.model
        self.temporal = server.temporal
        self.depth = server.depth
        self.device = server.device
        self.buckets = sorted(s.graph_buckets)
        self.max_bs = self.buckets[-1]
        dev, K, n = self.device, s.num_codebooks, self.max_bs
        self.static_user_codes = torch.zeros((n, K), dtype=torch.int64, device=dev)
        self.static_prev_codes = torch.zeros((n, K), dtype=torch.int64, device=dev)
        self.static_text_in = torch.full((n,), s.text_pad, dtype=torch.int64, device=dev)
        self.static_frames = torch.zeros(n, dtype=torch.int64, device=dev)
        self.static_slots = torch.zeros(n, dtype=torch.int64, device=dev)
        self.static_rows = torch.arange(n, dtype=torch.int64, device=dev)
        self.static_noise = torch.zeros((n, K, s.audio_vocab), dtype=torch.float32, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.pool = None
        self.depth.init_depth_buffers()

    def bucket_for(self, n: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def _frame(self, bs: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.model.frame_step(
            self.static_user_codes[:bs],
            self.static_prev_codes[:bs],
            self.static_text_in[:bs],
            self.static_frames[:bs],
            self.static_slots[:bs],
            self.static_rows[:bs],
            self.static_noise[:bs],
        )

    def record_all(self) -> None:
        for bs in reversed(self.buckets):
            self.record(bs)

    def record(self, bs: int) -> None:
        w = self.temporal.bind_bucket(bs)
        if getattr(w, "_use_cuda_graph", False) is not True:  # expect: FC103
            raise RuntimeError("temporal wrapper for bucket %d is not in graph mode" % bs)
        self.depth.bind_bucket(bs)
        self.temporal.plan_frame(bs, np.arange(bs, dtype=np.int64))
        self.depth.plan_codebooks(bs)
        torch.cuda.synchronize()  # ok: FC101
        self._frame(bs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._frame(bs)
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out
        newest = self.static_frames[:bs].max().item()  # expect: FC101
        logger.info("recorded frame graph for %d sessions (dummy frame %d)", bs, newest)

    def replay(self, bs: int, inputs: "FrameInputs") -> Tuple[torch.Tensor, torch.Tensor]:
        n = inputs.num_sessions
        self.static_user_codes[:n].copy_(inputs.user_codes)
        self.static_prev_codes[:n].copy_(inputs.prev_codes)
        self.static_text_in[:n].copy_(inputs.prev_text)
        self.static_frames[:n].copy_(inputs.frames)
        self.static_slots[:n].copy_(inputs.slots)
        self.static_noise[:n].exponential_().log_().neg_()
        slots_np = np.concatenate([inputs.slots_np, np.zeros(bs - n, dtype=inputs.slots_np.dtype)])
        self.temporal.plan_frame(bs, slots_np)
        self.depth.plan_codebooks(bs)
        self.graphs[bs].replay()
        text, codes = self.outputs[bs]
        return text[:n], codes[:n]
