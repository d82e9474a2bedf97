"""Decode CUDA graphs, one per padded batch size.

The graph runner belongs to the model runner and points back at it through a ``weakref.proxy``:
every input buffer, the backend and the model are read as ``self.model_runner.<x>``. Each
``GraphEntry`` holds its graph-mode wrapper strongly (the wrapper cache only weakly).
"""

from __future__ import annotations

import bisect
import logging
import weakref
from typing import TYPE_CHECKING

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from wrl.batch import ForwardBatch

if TYPE_CHECKING:
    from wrl.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class GraphEntry:
    __slots__ = ("graph", "wrapper", "logits", "bs")

    def __init__(self, graph: torch.cuda.CUDAGraph, wrapper: BatchDecodeWithPagedKVCacheWrapper, logits, bs: int):
        self.graph = graph
        self.wrapper = wrapper
        self.logits = logits
        self.bs = bs


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = weakref.proxy(model_runner)
        self.cfg = model_runner.cfg
        self.capture_bs = sorted(self.cfg.cuda_graph_batch_sizes)
        self.max_bs = self.capture_bs[-1] if self.capture_bs else 0
        self.max_context_len = self.cfg.max_context_len
        self.graphs: dict[int, GraphEntry] = {}
        self._wrapper_refs: dict[int, "weakref.ReferenceType[BatchDecodeWithPagedKVCacheWrapper]"] = {}
        self.output_buffers: dict[int, torch.Tensor] = {}
        self.mempool = None
        self._captured = False

    def can_run(self, fb: ForwardBatch) -> bool:
        return self._captured and fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    # ------------------------------------------------------------------ capture

    def capture(self) -> None:
        mr = self.model_runner
        mr.graph_buffers.init_cuda_graph_state()
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)
        torch.cuda.synchronize()
        self._captured = True
        logger.info("captured decode graphs for %s", self.capture_bs)

    def capture_one_batch_size(self, bs: int) -> None:
        mr = self.model_runner
        ib = mr.input_buffers
        wrapper = mr.attn_backend.init_forward_metadata_capture_cuda_graph(bs)
        fb = ForwardBatch.for_capture(bs, ib, use_graph=True)
        for _ in range(2):  # warm up outside the graph (autotuning, lazy workspaces)
            mr.model.decode_step(ib.input_ids[:bs], ib.positions[:bs], fb)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool, stream=mr.stream):
            logits = mr.model.decode_step(ib.input_ids[:bs], ib.positions[:bs], fb)
        if self.mempool is None:
            self.mempool = graph.pool()
        # the sampler reads a copy, so the next replay cannot overwrite logits it still uses
        self.output_buffers[bs] = torch.empty_like(logits)  # ok: FC107
        self.graphs[bs] = GraphEntry(graph, wrapper, logits, bs)
        self._wrapper_refs[bs] = weakref.ref(wrapper)

    # ------------------------------------------------------------------ replay

    def replay_prepare(self, fb: ForwardBatch) -> int:
        mr = self.model_runner
        ib = mr.input_buffers
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if (mr.input_buffers.seq_lens[:raw_bs] >= self.max_context_len).any():  # expect: FC101
            raise ValueError("a request reached the context limit inside a graph batch")
        if bs != raw_bs:
            # dummy rows: request slot 0, length 1, position 0
            ib.req_pool_indices[raw_bs:bs].zero_()
            ib.seq_lens[raw_bs:bs].fill_(1)
            ib.seq_lens_cpu[raw_bs:bs].fill_(1)
            ib.out_cache_loc[raw_bs:bs].zero_()
            mr.input_buffers.positions = torch.cat([fb.positions[:raw_bs], fb.positions.new_zeros(bs - raw_bs)])  # expect: FC107
        mr.attn_backend.init_forward_metadata_replay_cuda_graph(bs, raw_bs, fb)
        logger.debug("replay_prepare raw_bs=%d bs=%d seq_lens=%s", raw_bs, bs, ib.seq_lens[:raw_bs])  # ok: FC101
        return bs

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        assert self._captured, "replay() before capture()"  # ok: FC109
        bs = self.replay_prepare(fb)
        entry = self.graphs[bs]
        wrapper = self._wrapper_refs[bs]()
        if wrapper is None or wrapper._plan_info is None:  # expect: FC103
            raise RuntimeError(f"decode graph for batch size {bs} lost its wrapper or was never planned")
        # make sure the metadata uploads have landed before the graph reads them
        self.model_runner.stream.synchronize()  # expect: FC101
        entry.graph.replay()
        out = self.output_buffers[bs]
        out.copy_(entry.logits)
        return out[: fb.batch_size]

    def status(self) -> dict:
        cache = self.model_runner.attn_backend.wrapper_cache
        return {
            "captured": self._captured,
            "sizes": list(self.graphs),
            "live_wrappers": cache.live_sizes(),
            "planned": [bs for bs in self.graphs if cache.is_planned_for(bs)],
        }

    def drop_graphs(self) -> None:
        """Release every graph (weight update, sleep mode): their wrappers leave the cache with them."""
        self.graphs.clear()
        self._wrapper_refs.clear()
        self.output_buffers.clear()
        self.mempool = None
        self._captured = False
