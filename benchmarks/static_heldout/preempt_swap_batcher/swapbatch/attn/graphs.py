"""Decode CUDA graphs per batch bucket.

Each bucket has its own graph-mode decode wrapper bound to its own index buffers (kept in ``self.bufs[bs]``) and
pinned host mirrors that ``plan()`` reads. The captured region runs the model's decode and scales the logits by
the per-row temperatures, so ``self.temperatures`` is a graph input too.
"""
from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from swapbatch.attn.decode_backend import FlashInferDecodeBackend
from swapbatch.worker import AttnContext, SwapModel


@dataclass
class GraphRecord:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor


class DecodeGraphs:
    def __init__(
        self, model: SwapModel, backend: FlashInferDecodeBackend, kv_caches: List[torch.Tensor], buckets: List[int],
        max_blocks_per_seq: int, device: str = "cuda",
    ) -> None:
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.buckets = sorted(buckets)
        self.max_bs = self.buckets[-1]
        self.max_blocks = max_blocks_per_seq
        self.device = device
        self.graph_workspace = torch.zeros(int(os.environ.get("SWAPBATCH_GRAPH_WORKSPACE_BYTES", 128 << 20)), dtype=torch.uint8, device=device)  # expect: FC106
        self.records: Dict[int, GraphRecord] = {}
        self.bufs: Dict[int, Dict[str, torch.Tensor]] = {}
        self.indptr_host: Dict[int, torch.Tensor] = {}
        self.last_page_len_host: Dict[int, torch.Tensor] = {}
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int32, device=device)
        self.batch_indices = torch.arange(self.max_bs, dtype=torch.int32, device=device)
        self.temperatures = torch.ones(self.max_bs, dtype=torch.float32, device=device)
        self.pool = None

    def bucket_for(self, n: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    # ------------------------------------------------------------------ capture

    def _bind_bucket(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        indices = torch.zeros(bs * self.max_blocks, dtype=torch.int32, device=self.device)
        last_page_len = torch.empty(bs, dtype=torch.int32, device=self.device)
        last_page_len.fill_(1)  # ok: FC104
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last_page_len,
        )
        self.backend.graph_wrappers[bs] = w
        self.bufs[bs] = {"kv_indptr": indptr, "kv_indices": indices, "last_page_len": last_page_len}
        self.indptr_host[bs] = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host[bs] = torch.ones(bs, dtype=torch.int32, pin_memory=True)
        return w

    def record_buckets(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        b = self.backend
        for bs in reversed(self.buckets):
            w = self._bind_bucket(bs)
            ih = self.indptr_host[bs]
            ih.copy_(torch.arange(bs + 1, dtype=torch.int32))
            w.plan(ih, self.bufs[bs]["kv_indices"], self.last_page_len_host[bs], b.num_heads, b.num_kv_heads, b.head_dim, b.block_size)
            bufs = self.bufs[bs]
            ctx = AttnContext(
                self.batch_indices[:bs], self.positions[:bs], bufs["kv_indptr"], bufs["kv_indices"], bufs["last_page_len"], bs
            )
            for _ in range(2):
                self._run(bs, ctx)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                logits = self._run(bs, ctx)
            self.pool = graph.pool()
            self.records[bs] = GraphRecord(graph, self.input_ids[:bs], self.positions[:bs], logits)

    def _run(self, bs: int, ctx: AttnContext) -> torch.Tensor:
        logits = self.model.decode(self.input_ids[:bs], self.positions[:bs], self.kv_caches, ctx)
        return logits / self.temperatures[:bs, None]

    # ------------------------------------------------------------------ replay

    def prepare_replay(
        self, n: int, indptr_host: torch.Tensor, indices_host: torch.Tensor, last_page_len_host: torch.Tensor,
        indices_dev: torch.Tensor, input_ids_host: torch.Tensor, temperatures: Optional[List[float]],
    ) -> int:
        bs = self.bucket_for(n)
        bufs = self.bufs[bs]
        nnz = int(indptr_host[n])
        ih, lh = self.indptr_host[bs], self.last_page_len_host[bs]
        ih[: n + 1].copy_(indptr_host[: n + 1])
        ih[n + 1 :] = nnz
        lh[:n].copy_(last_page_len_host[:n])
        lh[n:] = 1
        # a decode step of the same sequences keeps its page list: skip the index copy then
        if not torch.equal(bufs["kv_indices"][:nnz], indices_dev[:nnz]):  # expect: FC101
            bufs["kv_indices"][:nnz].copy_(indices_host[:nnz], non_blocking=True)  # ok: FC104
        self.input_ids[:n].copy_(input_ids_host[:n], non_blocking=True)
        if temperatures is None:
            # greedy batch
            self.temperatures = torch.ones(self.max_bs, dtype=torch.float32, device=self.device)  # expect: FC107
        else:
            self.temperatures[:n].copy_(torch.tensor(temperatures, dtype=torch.float32), non_blocking=True)
        b = self.backend
        self.backend.graph_wrappers[bs].plan(  # ok: FC102
            ih, bufs["kv_indices"], lh, b.num_heads, b.num_kv_heads, b.head_dim, b.block_size,
            q_data_type=torch.bfloat16, kv_data_type=b.kv_cache_dtype,
        )
        return bs

    def replay(self, bs: int, n: int, positions: torch.Tensor) -> torch.Tensor:
        rec = self.records.get(bs)
        # positions come from the engine's per-step buffer, which the next step refills while this replay
        # may still be queued: give the graph its own copy
        rec.positions = positions.clone()  # expect: FC107
        rec.graph.replay()
        return rec.logits[:n]
