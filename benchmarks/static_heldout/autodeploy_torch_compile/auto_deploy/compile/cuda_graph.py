"""CUDA graphs around the torch.compile'd model, one per decode batch bucket."""

from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import nn


class CapturedGraph(nn.Module):
    def __init__(
        self,
        model: nn.Module,
        *,
        batch_sizes: Sequence[int],
        max_position: int,
        device: torch.device,
        compile_backend: str = "inductor",
    ):
        super().__init__()
        self.model = model
        self.compiled = torch.compile(model, backend=compile_backend, dynamic=True)
        self.batch_sizes = sorted(batch_sizes)
        self.max_position = max_position
        self.device = device
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self._input_buffers: List[torch.Tensor] = []
        self._out_buffers: Dict[int, torch.Tensor] = {}
        self._pool = None

    def bucket_for(self, n: int) -> Optional[int]:
        return next((b for b in self.batch_sizes if b >= n), None)

    @torch.inference_mode()
    def capture_graph(self, *args: torch.Tensor, before_capture: Optional[Callable[[int], None]] = None) -> None:
        max_bs = self.batch_sizes[-1]
        self._input_buffers = [
            torch.zeros((max_bs, *a.shape[1:]), dtype=a.dtype, device=self.device) for a in args
        ]
        for bs in reversed(self.batch_sizes):
            inputs = [buf[:bs] for buf in self._input_buffers]
            if before_capture is not None:
                before_capture(bs)
            for _ in range(3):  # compile and warm up outside the graph
                self.compiled(*inputs)
            torch.cuda.synchronize()  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self.compiled(*inputs)
            self._pool = graph.pool()
            self.graphs[bs] = graph
            self._out_buffers[bs] = out

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[0]
        bs = self.bucket_for(n)
        if bs is None or bs not in self.graphs:
            return self.compiled(input_ids, position_ids, *extra)
        # positions beyond the rope table the graphs were captured with run eagerly
        if bool((position_ids >= self.max_position).any()):  # expect: FC101
            return self.compiled(input_ids, position_ids, *extra)
        for i, inp in enumerate((input_ids, position_ids, *extra)):
            if inp.dtype != self._input_buffers[i].dtype:
                self._input_buffers[i] = torch.zeros(self._input_buffers[i].shape, dtype=inp.dtype, device=self.device)  # expect: FC107
            self._input_buffers[i][:n].copy_(inp, non_blocking=True)
        self.graphs[bs].replay()
        return self._out_buffers[bs][:n]
