"""Decode CUDA graphs, one per padded batch size.

The runner is a thin shell around the attention backend: whatever it does not define
itself (the page-table buffers, the graph wrappers, the backend's settings) it reads from
the backend through ``__getattr__``, so that the capture and replay code reads like the
backend's own.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch

from .descriptors import GraphInput, descriptor_slots
from .forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from .model_runner import ModelRunner

logger = logging.getLogger(__name__)


class GraphEntry:
    __slots__ = ("graph", "logits", "bs")

    def __init__(self, graph: torch.cuda.CUDAGraph, logits: torch.Tensor, bs: int) -> None:
        self.graph = graph
        self.logits = logits
        self.bs = bs


class CudaGraphRunner:
    __slots__ = (
        "model_runner",
        "backend",
        "device",
        "capture_bs",
        "max_bs",
        "graphs",
        "pool",
        "stream",
        "_seq_lens",
    ) + descriptor_slots("input_ids", "positions", "out_cache_loc", "req_pool_indices")

    # Graph inputs: assigning one copies into the storage the graphs were captured with.
    input_ids = GraphInput(lambda o: o.max_bs, torch.int64)
    positions = GraphInput(lambda o: o.max_bs, torch.int64)
    out_cache_loc = GraphInput(lambda o: o.max_bs, torch.int64)
    req_pool_indices = GraphInput(lambda o: o.max_bs, torch.int64)

    def __init__(self, model_runner: "ModelRunner") -> None:
        self.model_runner = model_runner
        self.backend = model_runner.attn_backend
        self.device = model_runner.device
        self.capture_bs: List[int] = model_runner.cfg.capture_batch_sizes()
        self.max_bs = self.capture_bs[-1]
        self.graphs: Dict[int, GraphEntry] = {}
        self.pool: Optional[Any] = None
        self.stream = torch.cuda.Stream(device=self.device)
        self._seq_lens: Optional[torch.Tensor] = None
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.backend.init_cuda_graph_state(self.capture_bs)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the runner itself lacks.
        if name in ("backend", "model_runner") or name.startswith(("__", "_dm_")):
            raise AttributeError(name)
        return getattr(self.backend, name)

    @property
    def seq_lens(self) -> torch.Tensor:
        """Captured sequence lengths (the trtllm-gen draft kernel reads them inside the graph)."""
        return self._seq_lens

    @seq_lens.setter
    def seq_lens(self, value: torch.Tensor) -> None:
        # keep a private copy: the scheduler recycles the batch's tensors
        self._seq_lens = value.clone()  # expect: FC107

    # -- capture --------------------------------------------------------------------------

    def capture(self) -> None:
        """Record every bucket, largest first, in one memory pool."""
        torch.cuda.synchronize(self.device)  # ok: FC101
        with torch.cuda.stream(self.stream):
            for bs in reversed(self.capture_bs):
                self.graphs[bs] = self.capture_one_batch_size(bs)
        logger.info("captured %d decode graphs (max bs %d)", len(self.graphs), self.max_bs)

    def capture_one_batch_size(self, bs: int) -> GraphEntry:
        wrapper = self.graph_wrappers[bs]
        if wrapper._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for bs={bs} was built for another batch size")
        if not wrapper.is_cuda_graph_enabled:  # ok: FC103
            raise RuntimeError(f"decode wrapper for bs={bs} is not in CUDA-graph mode")
        logger.info("capturing bs=%d on the %s kernels", bs, self._backend)  # ok: FC103
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            out_cache_loc=self.out_cache_loc[:bs],
            positions=self.positions[:bs],
            use_cascade=False,
        )
        self.backend.init_forward_metadata_capture_cuda_graph(bs, self.req_pool_indices[:bs], self.seq_lens[:bs])
        model = self.model_runner.model
        drafter = self.model_runner.drafter
        for _ in range(2):  # warm-up outside the graph: JIT and allocator
            model(fb)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            logits = model(fb)
            if drafter is not None:
                drafter.draft_forward(fb, logits)
        if self.pool is None:
            self.pool = graph.pool()
        return GraphEntry(graph, logits, bs)

    # -- replay ---------------------------------------------------------------------------

    def can_run(self, fb: ForwardBatch) -> bool:
        assert self.graphs, "can_run() called before capture()"  # ok: FC109
        return fb.batch_size <= self.max_bs and not fb.use_cascade

    def _bucket(self, raw_bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        if raw_bs > self.max_bs:
            raise ValueError(f"batch of {raw_bs} exceeds the largest captured size {self.max_bs}")
        bs = self._bucket(raw_bs)
        self.input_ids = fb.input_ids
        self.positions = fb.positions.clamp(min=0)  # ok: FC107
        self.out_cache_loc = fb.out_cache_loc
        self.req_pool_indices = fb.req_pool_indices
        self.seq_lens = fb.seq_lens
        self.backend.init_forward_metadata_replay_cuda_graph(bs, raw_bs, self.req_pool_indices[:bs], fb.seq_lens_cpu)
        # the kernels divide by the last-page length: never let a real row reach zero
        self.kv_last_page_len[:raw_bs].clamp_(min=1)  # expect: FC104
        self.model_runner.stats.kv_pages = int(self.kv_indptr[raw_bs])  # expect: FC101
        entry = self.graphs[bs]
        entry.graph.replay()
        return entry.logits[:raw_bs]
