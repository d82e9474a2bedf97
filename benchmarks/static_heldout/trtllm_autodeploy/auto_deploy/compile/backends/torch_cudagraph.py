"""``CapturedGraph``: captures the exported GraphModule once per batch size and replays it."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from auto_deploy.utils.cuda_graph import CudaGraphWarmUpPhase

logger = logging.getLogger(__name__)


class CapturedGraph(nn.Module):
    def __init__(self, model: nn.Module, cuda_graph_batch_sizes: List[int], num_batched_inputs: int = 1):
        super().__init__()
        self.model = model
        self.cuda_graph_max_batch_size = max(cuda_graph_batch_sizes)
        self.cuda_graph_batch_sizes = sorted(cuda_graph_batch_sizes, reverse=True)
        self.num_batched_inputs = num_batched_inputs
        self._use_cuda_graph = len(cuda_graph_batch_sizes) > 0  # ok: FC103
        self.cudagraphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self._input_buffers: List[torch.Tensor] = []
        self._out_buffer_flat: Dict[int, List[torch.Tensor]] = {}
        self._out_spec: Optional[TreeSpec] = None
        self._args_hash: Optional[Tuple[int, ...]] = None

    def _get_hash(self, flat_args: Sequence[Any]) -> Tuple[int, ...]:
        return tuple(hash(a) for a in flat_args)

    def _capture_one_graph(self, *args, **kwargs) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.model(*args, **kwargs)
        out_flat, self._out_spec = tree_flatten(out)
        self._out_buffer_flat[args[0].shape[0]] = out_flat
        for o in out_flat:
            logger.debug(f"captured output of shape {o.shape}")  # ok: FC101
        return graph

    def capture_graph(self, get_args_kwargs: Callable[[int], Tuple[tuple, dict]], warm_up_iters: int = 3):
        for bs in self.cuda_graph_batch_sizes:
            args, kwargs = get_args_kwargs(bs)
            flat, _ = tree_flatten((args, kwargs))
            if not self._input_buffers:
                self._input_buffers = [a.clone() for a in flat[: self.num_batched_inputs]]
            with CudaGraphWarmUpPhase():
                for _ in range(warm_up_iters):
                    self.model(*args, **kwargs)
            torch.cuda.synchronize()  # ok: FC101
            self.cudagraphs[bs] = self._capture_one_graph(*args, **kwargs)

    def round_to_cuda_batch_size(self, batch_size: int) -> int:
        return min((bs for bs in self.cuda_graph_batch_sizes if bs >= batch_size), default=batch_size)

    def forward(self, *args, **kwargs) -> Any:
        flat_args, args_spec = tree_flatten((args, kwargs))
        args_batched = flat_args[: self.num_batched_inputs]
        batch_size = int(args_batched[0].shape[0])  # ok: FC101
        rounded = self.round_to_cuda_batch_size(batch_size)
        if not self._use_cuda_graph or rounded not in self.cudagraphs:
            return self.model(*args, **kwargs)
        assert self._out_spec is not None  # ok: FC109
        for in_buffer, arg in zip(self._input_buffers, args_batched):
            in_buffer[: arg.shape[0]].copy_(arg, non_blocking=True)
        self.cudagraphs[rounded].replay()
        return tree_unflatten([o[:batch_size] for o in self._out_buffer_flat[rounded]], self._out_spec)
