"""The FlashInfer paged builder: decode, prefill and mixed batches, dispatched on the batch's class."""
from __future__ import annotations

import functools
from typing import Dict

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from mcmb.batches import AttnMetadata, BatchBase, DecodeBatch, MixedBatch, PrefillBatch
from mcmb.config import _WS_MIB
from mcmb_builders.base import MetadataBuilderBase
from mcmb_builders.mixins import GraphBufferMixin, PagedIndexMixin, PlanCacheMixin, block_table_to_indices_kernel


class FlashInferPagedBuilder(PlanCacheMixin, GraphBufferMixin, PagedIndexMixin, MetadataBuilderBase, attn_type="paged"):
    def __init__(self, **kw):
        super().__init__(**kw)
        cfg, dev = self.cfg, self.device
        self.workspace = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=dev)  # expect: FC105
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, self.kv_layout, backend=self.decode_backend)
        self._decode_plan = self.decode_wrapper.plan
        self.tc_workspace = torch.empty_like(self.workspace)  # ok: FC105
        self.tc_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.tc_workspace, self.kv_layout, use_tensor_cores=True)
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=dev)  # ok: FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self.kv_layout)
        self.ragged_workspace = torch.empty(_WS_MIB["ragged"] << 20, dtype=torch.uint8, device=dev)  # expect: FC106
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, self.kv_layout)
        self.graph_workspace = torch.empty(self.GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)  # expect: FC106
        self.eager_indices = torch.empty(cfg.max_num_tokens, dtype=torch.int32, device=dev)

    def init_graph_wrappers(self) -> None:
        assert not self.graph_wrappers, "graph wrappers built twice"  # ok: FC109
        self.graph_bufs["kv_indptr"].zero_()  # ok: FC104
        for bs in self.cfg.graph_batch_sizes:
            if bs <= self.max_graph_bs:
                self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                    self.graph_workspace, self.kv_layout, use_cuda_graph=True, backend="fa2",
                    paged_kv_indptr_buffer=self.graph_bufs["kv_indptr"][: bs + 1],
                    paged_kv_indices_buffer=self.graph_bufs["kv_indices"],
                    paged_kv_last_page_len_buffer=self.graph_bufs["kv_last_page_len"][:bs],
                )

    @functools.singledispatchmethod
    def build(self, batch: BatchBase) -> AttnMetadata:
        raise TypeError(f"{type(self).__name__} builds no metadata for {type(batch).__name__}")

    @build.register
    def build_decode(self, batch: DecodeBatch) -> AttnMetadata:
        indptr, indices, last = self.paged_indices(batch)
        n = int(indptr[-1])
        if n > self.eager_indices.numel():
            self.eager_indices = torch.empty(2 * n, dtype=torch.int32, device=self.device)  # expect: FC107
        if self.needs_plan(self.decode_wrapper, self.plan_key("decode", batch)):
            self._plan_decode(batch, indptr, self.eager_indices[:n], last)
        self.eager_indices[:n].copy_(torch.from_numpy(indices), non_blocking=True)  # ok: FC104
        return AttnMetadata("decode", batch.num_seqs, batch.num_seqs)

    def _plan_decode(self, batch: DecodeBatch, indptr: np.ndarray, indices: torch.Tensor, last: np.ndarray) -> None:
        if batch.num_seqs >= self.cfg.tensor_core_min_bs:
            self.tc_decode_wrapper.plan(  # ok: FC102
                torch.from_numpy(indptr), indices, torch.from_numpy(last), *self.cfg.dims, **self.plan_kwargs())
            return
        indptr_gpu = torch.from_numpy(indptr).to(self.device, non_blocking=True)
        self._decode_plan(indptr_gpu, indices, torch.from_numpy(last), *self.cfg.dims, **self.plan_kwargs())  # expect: FC102

    @build.register
    def build_prefill(self, batch: PrefillBatch) -> AttnMetadata:
        qo_indptr_cpu = batch.qo_indptr.to("cpu")  # expect: FC101
        if batch.prefix_lens is None:
            self.ragged_wrapper.plan(qo_indptr_cpu, qo_indptr_cpu, *self.cfg.dims[:3], causal=True)  # ok: FC102
            return AttnMetadata("ragged", batch.num_seqs, int(qo_indptr_cpu[-1]))  # ok: FC101
        indptr, indices, last = self.paged_indices(batch)
        self.prefill_wrapper.plan(  # ok: FC102
            qo_indptr_cpu, torch.from_numpy(indptr), torch.from_numpy(indices).to(self.device), torch.from_numpy(last),
            *self.cfg.dims, causal=True, **self.plan_kwargs())
        return AttnMetadata("prefill", batch.num_seqs, int(qo_indptr_cpu[-1]))

    @build.register
    def build_mixed(self, batch: MixedBatch) -> AttnMetadata:
        num_decodes = int((batch.query_lens == 1).sum())  # expect: FC101
        indptr, _, last = self.paged_indices(batch)
        meta = AttnMetadata("mixed", batch.num_seqs, int(batch.qo_indptr_np[-1]), num_decodes=num_decodes)  # ok: FC101
        meta.kv_indptr_gpu = torch.empty(batch.num_seqs + 1, dtype=torch.int32, device=self.device)  # ok: FC107
        meta.kv_indptr_gpu.copy_(torch.from_numpy(indptr), non_blocking=True)
        indices_buf = self.graph_bufs["kv_indices"]  # the largest index buffer holds any mixed step
        self.prefill_wrapper.plan(  # expect: FC102
            batch.qo_indptr, torch.from_numpy(indptr), indices_buf, torch.from_numpy(last),
            *self.cfg.dims, causal=True, **self.plan_kwargs())
        bt = batch.block_table
        block_table_to_indices_kernel[(batch.num_seqs,)](bt, bt.stride(0), meta.kv_indptr_gpu, indices_buf, BLOCK=128)  # expect: FC104
        return meta

    def build_for_cudagraph_capture(self, bs: int) -> AttnMetadata:
        self.graph_staging["kv_indptr"][: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.graph_staging["kv_last_page_len"][:bs] = 1
        num_pages = int(self.graph_bufs["kv_indptr"][bs])  # expect: FC101
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.graph_staging["kv_indptr"][: bs + 1], self.graph_bufs["kv_indices"][: max(num_pages, bs)],
            self.graph_staging["kv_last_page_len"][:bs], *self.cfg.dims, **self.plan_kwargs())
        return AttnMetadata("decode", bs, bs, graph_bs=bs)

    def plan_replay(self, bs: int, batch: DecodeBatch) -> None:
        indptr, indices, last = self.paged_indices(batch)
        real, n = batch.num_seqs, int(indptr[-1])
        if n > self.graph_bufs["kv_indices"].numel():
            self.graph_bufs["kv_indices"] = torch.empty(2 * n, dtype=torch.int32, device=self.device)  # expect: FC107
        self.graph_staging["kv_indptr"][: real + 1] = torch.from_numpy(indptr)
        self.graph_staging["kv_indptr"][real + 1 : bs + 1] = n
        self.graph_staging["kv_last_page_len"][:real] = torch.from_numpy(last)
        bufs, staging = self.graph_bufs, self.graph_staging
        bufs["kv_indptr"][: bs + 1].copy_(staging["kv_indptr"][: bs + 1], non_blocking=True)  # ok: FC104
        bufs["kv_indices"][:n].copy_(torch.from_numpy(indices), non_blocking=True)  # ok: FC104
        bufs["kv_last_page_len"][:real].copy_(staging["kv_last_page_len"][:real], non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # expect: FC102
            bufs["kv_indptr"][: bs + 1], bufs["kv_indices"], bufs["kv_last_page_len"][:bs], *self.cfg.dims,
            **self.plan_kwargs())
        bufs["kv_last_page_len"][real:bs] = 1  # expect: FC104
        self.graph_staging["kv_last_page_len"][real:bs] = 1  # ok: FC104

    def run_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        if meta.num_seqs >= self.cfg.tensor_core_min_bs:
            return self.tc_decode_wrapper.run(q, kv_cache)  # expect: FC108
        w = self.graph_wrappers[meta.graph_bs] if meta.graph_bs is not None else self.decode_wrapper
        return w.run(q, kv_cache)  # ok: FC108

    def run_prefill(self, q, k, v, kv_cache: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        if meta.kind == "ragged":
            return self.ragged_wrapper.run(q, k, v)  # ok: FC108
        return self.prefill_wrapper.run(q, kv_cache)  # ok: FC108

    def describe_plans(self) -> Dict[str, object]:
        out: Dict[str, object] = {f"graph{bs}": self.plan_debug(w) for bs, w in self.graph_wrappers.items()}
        out["workspace_int"] = self.decode_wrapper.__dict__["_int_workspace_buffer"].numel()  # expect: FC103
        return out
