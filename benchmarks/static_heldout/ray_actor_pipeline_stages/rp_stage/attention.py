import functools
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from raypp import MicroBatch, PipelineConfig
from rp_stage.workspace import build_local_wrapper, graph_workspace, overflow_workspace


@dataclass
class StageMeta:
    num_reqs: int
    num_pages: int
    kv_indptr_cpu: torch.Tensor
    last_page_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    seq_lens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    block_tables: torch.Tensor
    max_len: int


class StageMetaBuilder:
    def __init__(self, cfg: PipelineConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)

    def build(self, mb: MicroBatch) -> StageMeta:
        page, dev = self.cfg.page_size, self.device
        lens_np = mb.seq_lens_cpu.numpy()
        pages_np = (lens_np + page - 1) // page
        indptr_cpu = torch.from_numpy(np.concatenate([[0], np.cumsum(pages_np)]).astype(np.int32))
        idx_np = np.concatenate([mb.page_table_np[i, :p] for i, p in enumerate(pages_np)]).astype(np.int32)
        pos_np = mb.positions_cpu.numpy()
        slots_np = mb.page_table_np[np.arange(mb.num_reqs), pos_np // page] * page + pos_np % page
        return StageMeta(
            num_reqs=mb.num_reqs, num_pages=int(idx_np.size), kv_indptr_cpu=indptr_cpu,
            last_page_cpu=torch.from_numpy(((lens_np - 1) % page + 1).astype(np.int32)),
            kv_indptr=indptr_cpu.to(dev, non_blocking=True), kv_indices=torch.from_numpy(idx_np).to(dev, non_blocking=True),
            seq_lens=mb.seq_lens_cpu.to(dev, non_blocking=True), positions=mb.positions_cpu.to(dev, non_blocking=True),
            slots=torch.from_numpy(slots_np.astype(np.int64)).to(dev, non_blocking=True),
            block_tables=torch.from_numpy(mb.page_table_np).to(dev, non_blocking=True), max_len=int(lens_np.max()))


def _layout_of(wrapper_obj) -> str:
    return wrapper_obj._kv_layout  # expect: FC103


class StageAttention:
    """The wrappers, workspaces and graph-bound buffers of one stage's layers:
    graph-mode trtllm-gen decode per micro-batch bucket, a sliding-window
    wrapper, an FA2 prefill and an eager trtllm-gen decode for oversize groups."""

    PREFILL_WS_BYTES = 192 * 1024 * 1024

    def __init__(self, cfg: PipelineConfig, first_layer: int):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self._kv_layout = cfg.kv_layout
        self.first_layer = first_layer
        self.buckets = sorted(cfg.microbatch_buckets)
        self.sm_scale = cfg.head_dim ** -0.5
        self.kv_indptr: List[torch.Tensor] = []
        self.kv_indices: List[torch.Tensor] = []
        self.kv_last_page: List[torch.Tensor] = []
        self.indptr_host: List[torch.Tensor] = []
        self.last_host: List[torch.Tensor] = []
        self.graph_wrappers: List[BatchDecodeWithPagedKVCacheWrapper] = []
        ws = graph_workspace(cfg.graph_workspace_bytes(), self.device)
        for bs in self.buckets:
            indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
            indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
            last = torch.ones(bs, dtype=torch.int32, device=self.device)
            self.kv_indptr.append(indptr)
            self.kv_indices.append(indices)
            self.kv_last_page.append(last)
            self.indptr_host.append(torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True))
            self.last_host.append(torch.ones(bs, dtype=torch.int32, pin_memory=True))
            self.graph_wrappers.append(BatchDecodeWithPagedKVCacheWrapper(
                ws, self._kv_layout, use_cuda_graph=True, backend="trtllm-gen", paged_kv_indptr_buffer=indptr,
                paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last))
        self.describe = [functools.partial(_layout_of, w) for w in self.graph_wrappers]
        self.local_wrapper = build_local_wrapper(torch.zeros(cfg.graph_workspace_bytes(), dtype=torch.uint8,
                                                             device=self.device), self._kv_layout)
        self.prefill_workspace = torch.zeros(self.PREFILL_WS_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout, backend="fa2")
        self.overflow_bytes = cfg.overflow_workspace_bytes()
        self._eager: Optional[StageMeta] = None

    def layout(self) -> str:
        return self._kv_layout  # ok: FC103

    def init_stage_buffers(self) -> None:
        for indptr, last in zip(self.kv_indptr, self.kv_last_page):
            indptr.zero_()
            last.fill_(1)  # ok: FC104

    def _heads(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                    page_size=c.page_size, q_data_type=c.dtype)

    def _pad_tail(self, bi: int, n: int) -> None:
        # padded rows read one token of page 0
        self.kv_last_page[bi][n:].fill_(1)

    def prime_bucket(self, bi: int, meta: StageMeta) -> None:
        self.graph_wrappers[bi].plan(meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_cpu, **self._heads())
        self.local_wrapper.plan(meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_cpu,
                                window_left=self.cfg.sliding_window - 1, **self._heads())

    def plan_microbatch(self, bi: int, meta: StageMeta) -> None:
        n, m = meta.num_reqs, meta.num_pages
        self.kv_indices[bi][:m].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        indptr, last = self.indptr_host[bi], self.last_host[bi]
        indptr[: n + 1].copy_(meta.kv_indptr_cpu)
        indptr[n + 1 :] = m
        last[:n].copy_(meta.last_page_cpu)
        last[n:] = 1
        self.graph_wrappers[bi].plan(indptr, self.kv_indices[bi][:m], last, **self._heads())  # ok: FC102
        kw = dict(indptr=meta.kv_indptr, indices=meta.kv_indices, last_page_len=meta.last_page_cpu)
        self.local_wrapper.plan(**kw, window_left=self.cfg.sliding_window - 1, **self._heads())  # expect: FC102
        self._pad_tail(bi, n)  # expect: FC104

    def set_eager(self, meta: StageMeta) -> None:
        self._eager = meta

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int, bi: Optional[int]) -> torch.Tensor:
        if bi is None:
            e = self._eager
            return trtllm_batch_decode_with_kv_cache(q, kv_cache, overflow_workspace(self.overflow_bytes, self.device),
                                                     e.block_tables, e.seq_lens, e.max_len,
                                                     bmm1_scale=self.sm_scale, bmm2_scale=1.0)
        if layer_id % self.cfg.local_every == 1:
            return self.local_wrapper.run(q, kv_cache)  # expect: FC108
        return self.graph_wrappers[bi].run(q, kv_cache)  # ok: FC108
