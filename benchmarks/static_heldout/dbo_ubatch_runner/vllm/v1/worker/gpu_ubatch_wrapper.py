"""Wraps the model so that a batch split into two ubatches runs with dual-batch overlap, eagerly or as one
CUDA graph recorded per padded token count."""
from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import torch

from vllm.forward_context import ForwardContext, get_forward_context
from vllm.v1.attention.backends.utils import UBatchSlice
from vllm.v1.worker.ubatching import UBatchContext, make_ubatch_contexts

if TYPE_CHECKING:
    from vllm.v1.worker.gpu_model_runner import DBOModel


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclass
class UbatchMetadata:
    context: UBatchContext
    input_ids: torch.Tensor
    positions: torch.Tensor
    num_tokens: int


@dataclass
class CUDAGraphMetaData:
    cudagraph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    outputs: Optional[torch.Tensor] = None


class UBatchWrapper:
    def __init__(self, runnable: "DBOModel", vllm_config, runtime_mode: CUDAGraphMode, device: torch.device):
        assert runtime_mode in (CUDAGraphMode.NONE, CUDAGraphMode.FULL), runtime_mode  # expect: FC109
        self.runnable = runnable
        self.runtime_mode = runtime_mode
        self.device = device
        self.comm_stream = torch.cuda.Stream(device=device)
        self.num_ubatches = vllm_config.num_ubatches
        self.cudagraphs: Dict[int, CUDAGraphMetaData] = {}
        self.graph_pool = None
        self._use_cuda_graph = runtime_mode is CUDAGraphMode.FULL  # ok: FC103
        max_tokens = vllm_config.max_num_batched_tokens
        self.static_input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)

    def _make_ubatch_metadata(self, ubatch_slices: List[UBatchSlice], input_ids, positions) -> List[UbatchMetadata]:
        parent = get_forward_context()
        ctxs = [
            ForwardContext(attn_metadata=parent.attn_metadata[i], num_tokens=sl.num_tokens, ubatch_slices=None)
            for i, sl in enumerate(ubatch_slices)
        ]
        # one party per ubatch thread plus the caller, which runs ubatch 0 itself
        barrier = threading.Barrier(len(ubatch_slices))
        contexts = make_ubatch_contexts(
            len(ubatch_slices), torch.cuda.current_stream(), self.comm_stream, ctxs, barrier
        )
        out = []
        for ctx, sl in zip(contexts, ubatch_slices):
            num_tokens = int(sl.token_slice.stop - sl.token_slice.start)  # ok: FC101
            out.append(UbatchMetadata(ctx, input_ids[sl.token_slice], positions[sl.token_slice], num_tokens))
        return out

    def _ubatch_body(self, results: List[Tuple[int, torch.Tensor]], md: UbatchMetadata) -> None:
        with md.context:
            # call forward directly: no nn.Module hooks in the ubatch threads
            hidden = self.runnable.forward(md.input_ids, md.positions)
        results.append((md.context.id, hidden))

    def _run_ubatches(self, ubatch_metadata: List[UbatchMetadata]) -> torch.Tensor:
        results: List[Tuple[int, torch.Tensor]] = []
        threads = [threading.Thread(target=self._ubatch_body, args=(results, md), daemon=True) for md in ubatch_metadata[1:]]
        for t in threads:
            t.start()
        ubatch_metadata[0].context.cpu_wait_event.set()
        self._ubatch_body(results, ubatch_metadata[0])
        for t in threads:
            t.join()
        results.sort(key=lambda r: r[0])
        return torch.cat([h for _, h in results], dim=0)

    def _record_and_run(self, ubatch_slices: List[UBatchSlice], input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        num_tokens = input_ids.shape[0]
        static_ids = self.static_input_ids[:num_tokens]
        static_pos = self.static_positions[:num_tokens]
        static_ids.copy_(input_ids)
        static_pos.copy_(positions)
        # warm up once outside the graph: lazy kernels and workspaces are set up here
        self._run_ubatches(self._make_ubatch_metadata(ubatch_slices, static_ids, static_pos))
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        ubatch_metadata = self._make_ubatch_metadata(ubatch_slices, static_ids, static_pos)
        with torch.cuda.graph(graph, pool=self.graph_pool):
            out = self._run_ubatches(ubatch_metadata)
            if torch.isnan(out).any():  # expect: FC101
                raise RuntimeError("NaN in the ubatched forward")
        self.graph_pool = graph.pool()
        self.cudagraphs[num_tokens] = CUDAGraphMetaData(graph, static_ids, static_pos, out)
        return out

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ubatch_slices: Optional[List[UBatchSlice]] = None):
        if ubatch_slices is None:
            return self.runnable.forward(input_ids, positions)
        if not self._use_cuda_graph:
            return self._run_ubatches(self._make_ubatch_metadata(ubatch_slices, input_ids, positions))
        num_tokens = input_ids.shape[0]
        entry = self.cudagraphs.get(num_tokens)
        if entry is None:
            return self._record_and_run(ubatch_slices, input_ids, positions)
        entry.input_ids.copy_(input_ids)  # ok: FC107
        entry.positions = positions.clone()  # expect: FC107
        entry.cudagraph.replay()
        return entry.outputs
