"""Decode graphs per (TP degree, batch bucket); re-recorded after a rescale."""
from __future__ import annotations

import bisect
import logging
from typing import Dict, Tuple

import numpy as np
import torch

from elastictp.limits import EngineLimits
from etp_runtime.attn_state import TPAttnState
from etp_runtime.batch import StepBatch
from etp_runtime.model import ElasticLM

logger = logging.getLogger(__name__)


class TPGraphSet:
    _STATIC_INPUTS = ("input_ids", "positions")

    def __init__(self, limits: EngineLimits, device: torch.device) -> None:
        self.limits = limits
        self.buckets = sorted(limits.graph_buckets)
        max_bs = self.buckets[-1]
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[Tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[Tuple[int, int], torch.Tensor] = {}
        self.mem_pool = None

    def has(self, tp: int, n: int) -> bool:
        return n <= self.buckets[-1] and (tp, self.buckets[-1]) in self.graphs

    def drop_degree(self, tp: int) -> None:
        for key in [k for k in self.graphs if k[0] == tp]:
            del self.graphs[key]
            del self.outputs[key]

    def record_degree(self, tp: int, model: ElasticLM, state: TPAttnState) -> None:
        state.init_graph_wrappers()
        if self.mem_pool is None:
            self.mem_pool = torch.cuda.graph_pool_handle()
        heads = state.head_perm.cpu().numpy()  # expect: FC101
        logger.info("recording TP=%d graphs, local KV heads %s", tp, heads.tolist())
        for bs in reversed(self.buckets):
            indptr = np.arange(bs + 1, dtype=np.int32)
            indices = np.zeros(bs, dtype=np.int32)
            last = np.ones(bs, dtype=np.int32)
            state.graph_wrappers[bs].plan(
                torch.from_numpy(indptr), torch.from_numpy(indices), torch.from_numpy(last), **state._heads()
            )
            if state.layout.kv_replicated:
                state.plan_replica(indptr, indices, last)
            state.graph_bs = bs
            model.decode(self.input_ids[:bs], self.positions[:bs])
            torch.cuda.synchronize()  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.mem_pool):
                out = model.decode(self.input_ids[:bs], self.positions[:bs])
            self.graphs[(tp, bs)] = graph
            self.outputs[(tp, bs)] = out
        state.graph_bs = None

    def replay_step(
        self, tp: int, state: TPAttnState, batch: StepBatch, layout_np: Tuple[np.ndarray, np.ndarray, np.ndarray]
    ) -> torch.Tensor:
        n = batch.size
        bs = self.buckets[bisect.bisect_left(self.buckets, n)]
        for name in self._STATIC_INPUTS:
            setattr(self, name, getattr(batch, name).clone())  # expect: FC107
        ps = self.limits.page_size
        seq_pages = torch.div(batch.seq_lens + ps - 1, ps, rounding_mode="floor")
        if sum(seq_pages) > state.graph_kv_indices.numel():  # expect: FC101
            raise RuntimeError("graph index buffer too small for this batch")
        indptr_np, indices_np, last_np = layout_np
        nnz = int(indptr_np[-1])
        state.kv_indptr_cpu[: n + 1].copy_(torch.from_numpy(indptr_np))
        state.kv_indptr_cpu[n + 1 : bs + 1] = nnz
        state.kv_indices_cpu[:nnz].copy_(torch.from_numpy(indices_np))
        state.last_page_len_cpu[:n].copy_(torch.from_numpy(last_np))
        state.graph_kv_indices[:nnz].copy_(state.kv_indices_cpu[:nnz], non_blocking=True)  # ok: FC104
        state.graph_last_page_len[:n].copy_(state.last_page_len_cpu[:n], non_blocking=True)
        if state.layout.kv_replicated:
            state.plan_replica(indptr_np, indices_np, last_np)
        state.graph_wrappers[bs].plan(  # ok: FC102
            state.kv_indptr_cpu[: bs + 1],
            state.kv_indices_cpu[:nnz],
            state.last_page_len_cpu[:bs],
            **state._heads(),
        )
        # the kernel's indptr straight from the device lengths, no host round trip
        torch.cumsum(seq_pages, 0, out=state.graph_kv_indptr[1 : n + 1])  # expect: FC104
        state.graph_bs = bs
        self.graphs[(tp, bs)].replay()
        state.graph_bs = None
        return self.outputs[(tp, bs)][:n]
