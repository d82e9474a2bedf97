"""Two wrapper families planned per step: full (retrieval heads) and compressed (sink + window)."""

import math
from typing import Dict

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from razor import RazorBatch, RazorConfig, compressed_page_table
from rz_attn.workspaces import (
    comp_graph_workspace,
    compressed_decode_kwargs,
    eager_workspace,
    full_eager_workspace,
    full_graph_workspace,
)


class RazorBackend:
    def __init__(self, cfg: RazorConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"
        mb = cfg.max_batch_size
        i32 = dict(dtype=torch.int32, device=device)
        self.full_indptr = torch.zeros(mb + 1, **i32)
        self.full_indices = torch.zeros(mb * cfg.max_full_pages, **i32)
        self.full_last = torch.ones(mb, **i32)
        self.comp_indptr = torch.zeros(mb + 1, **i32)
        self.comp_indices = torch.zeros(mb * cfg.comp_width + 1, **i32)
        self.comp_last_len = torch.ones(mb, **i32)
        self.full_indptr_host = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.full_last_host = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.comp_indptr_host = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.comp_last_host = torch.ones(mb, dtype=torch.int32, pin_memory=True)

        full_ws = full_eager_workspace(cfg, device)
        self.full_eager = BatchDecodeWithPagedKVCacheWrapper(full_ws, self._kv_layout, backend="fa2")
        # the first dense layers attend with every kv head over the full pool
        self.dense_full = BatchDecodeWithPagedKVCacheWrapper(full_ws, self._kv_layout, backend="fa2")
        self.comp_eager = BatchDecodeWithPagedKVCacheWrapper(
            eager_workspace(cfg.eager_workspace_bytes(), device), self._kv_layout, **compressed_decode_kwargs(cfg)
        )
        self.full_graph: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.comp_graph: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.init_graph_wrappers()
        self.comp_last_len.fill_(1)  # ok: FC104

    def init_graph_wrappers(self) -> None:
        full_ws = full_graph_workspace(self.cfg, self.device)
        comp_ws = comp_graph_workspace(self.device)
        for bs in self.cfg.buckets:
            self.full_graph[bs] = BatchDecodeWithPagedKVCacheWrapper(
                full_ws, self._kv_layout, use_cuda_graph=True,
                paged_kv_indptr_buffer=self.full_indptr[: bs + 1],
                paged_kv_indices_buffer=self.full_indices,
                paged_kv_last_page_len_buffer=self.full_last[:bs],
            )
            self.comp_graph[bs] = BatchDecodeWithPagedKVCacheWrapper(
                comp_ws, self._kv_layout, use_cuda_graph=True,
                paged_kv_indptr_buffer=self.comp_indptr[: bs + 1],
                paged_kv_indices_buffer=self.comp_indices,
                paged_kv_last_page_len_buffer=self.comp_last_len[:bs],
            )

    def check_layouts(self) -> None:
        layout = self._kv_layout  # ok: FC103
        for bs, w in self.comp_graph.items():
            if w._kv_layout != layout:  # expect: FC103
                raise RuntimeError(f"bucket {bs}: compressed wrapper built with another layout")

    # ---------------------------------------------------------------- host mirrors
    def _fill_full_host(self, batch: RazorBatch, rows: int) -> int:
        n = batch.batch_size
        indptr = self.full_indptr_host.numpy()
        indptr[0] = 0
        np.cumsum(batch.full_page_counts_cpu[:n], out=indptr[1 : n + 1])
        indptr[n + 1 : rows + 1] = indptr[n]
        last = self.full_last_host.numpy()
        last[:n] = (batch.seq_lens_cpu[:n] - 1) % self.cfg.page_size + 1
        last[n:rows] = 1
        return int(indptr[n])

    def _fill_comp_host(self, batch: RazorBatch, rows: int) -> int:
        n = batch.batch_size
        pages = (batch.seq_lens_cpu[:n] + self.cfg.page_size - 1) // self.cfg.page_size
        indptr = self.comp_indptr_host.numpy()
        indptr[0] = 0
        np.cumsum(np.minimum(pages, self.cfg.comp_width), out=indptr[1 : n + 1])
        indptr[n + 1 : rows + 1] = indptr[n]
        last = self.comp_last_host.numpy()
        last[:n] = (batch.seq_lens_cpu[:n] - 1) % self.cfg.page_size + 1
        last[n:rows] = 1
        return int(indptr[n])

    def _heads(self, family: str):
        c = self.cfg
        if family == "full":
            return c.retrieval_kv_heads * c.group, c.retrieval_kv_heads
        if family == "dense":
            return c.num_qo_heads, c.num_kv_heads
        return c.compressed_kv_heads * c.group, c.compressed_kv_heads

    # ---------------------------------------------------------------- eager step
    def plan_step(self, batch: RazorBatch) -> None:
        c = self.cfg
        n = batch.batch_size
        longest = math.ceil(int(batch.seq_lens_cpu[:n].max()) / c.page_size)  # ok: FC101
        if longest > c.max_full_pages:
            raise ValueError(f"{longest} pages > {c.max_full_pages}")
        self._fill_full_host(batch, n)
        for family, w in (("full", self.full_eager), ("dense", self.dense_full)):
            qo, kv = self._heads(family)
            w.plan(self.full_indptr_host[: n + 1], batch.full_indices, self.full_last_host[:n],  # ok: FC102
                   qo, kv, c.head_dim, c.page_size, q_data_type=c.dtype)
        comp = compressed_page_table(batch.slot_table, batch.seq_lens, c.sink_pages, c.window_pages, c.page_size)
        qo, kv = self._heads("comp")
        self.comp_eager.plan(  # expect: FC102
            comp.kv_indptr, comp.packed, comp.last_page_len, qo, kv, c.head_dim, c.page_size, q_data_type=c.dtype
        )

    # ---------------------------------------------------------------- graph step
    def prepare_bucket(self, bs: int, batch: RazorBatch) -> None:
        c = self.cfg
        n = batch.batch_size
        span = math.ceil(batch.seq_lens.max() / c.page_size)  # expect: FC101
        if span > c.max_full_pages:
            raise ValueError(f"{span} pages > {c.max_full_pages}")
        num_full = self._fill_full_host(batch, bs)
        self.full_indices[:num_full].copy_(batch.full_indices[:num_full], non_blocking=True)
        qo, kv = self._heads("full")
        self.full_graph[bs].plan(self.full_indptr_host[: bs + 1], self.full_indices[:num_full],
                                 self.full_last_host[:bs], qo, kv, c.head_dim, c.page_size, q_data_type=c.dtype)
        qo, kv = self._heads("dense")
        self.dense_full.plan(self.full_indptr_host[: bs + 1], self.full_indices[:num_full],
                             self.full_last_host[:bs], qo, kv, c.head_dim, c.page_size, q_data_type=c.dtype)
        comp = compressed_page_table(batch.slot_table, batch.seq_lens, c.sink_pages, c.window_pages, c.page_size)
        num_comp = self._fill_comp_host(batch, bs)
        self.comp_indices[:num_comp].copy_(comp.packed[:num_comp], non_blocking=True)  # ok: FC104
        qo, kv = self._heads("comp")
        self.comp_graph[bs].plan(  # ok: FC102
            self.comp_indptr_host[: bs + 1], self.comp_indices[:num_comp], self.comp_last_host[:bs],
            qo, kv, c.head_dim, c.page_size, q_data_type=c.dtype,
        )
        self.comp_last_len[n:bs].fill_(1)  # expect: FC104
