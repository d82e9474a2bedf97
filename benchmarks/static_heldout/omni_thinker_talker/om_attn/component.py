"""Attention state of one decoder LM: its workspace, eager wrapper, graph wrappers per bucket and buffers."""

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from omni import ComponentConfig


@dataclass
class ComponentBatch:
    batch_size: int
    kv_indices: torch.Tensor  # device, packed pages
    page_counts_cpu: np.ndarray
    seq_lens_cpu: np.ndarray
    kv_indptr: Optional[torch.Tensor] = None  # device copy some schedulers keep
    mrope_positions: Optional[torch.Tensor] = None  # thinker only, device [3, n]
    prev_codes: Optional[torch.Tensor] = None  # talker only, device
    new_pages: Optional[torch.Tensor] = None  # talker only, device
    new_page_pos: Optional[torch.Tensor] = None


class ComponentAttention:
    def __init__(self, name: str, cc: ComponentConfig, device: torch.device, workspace: torch.Tensor,
                 eager_backend: str = "fa2"):
        self.name = name
        self.cc = cc
        self.device = device
        self.workspace = workspace
        self._backend = eager_backend  # ok: FC103
        mb = cc.max_batch_size
        self.bufs: Dict[str, torch.Tensor] = {
            "kv_indptr": torch.zeros(mb + 1, dtype=torch.int32, device=device),
            "kv_indices": torch.zeros(mb * cc.max_pages, dtype=torch.int32, device=device),
            "kv_last_page_len": torch.ones(mb, dtype=torch.int32, device=device),
            "mrope_positions": torch.zeros(3, mb, dtype=torch.long, device=device),
        }
        self.host = {
            "kv_indptr": torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True),
            "kv_last_page_len": torch.ones(mb, dtype=torch.int32, pin_memory=True),
        }
        self.eager = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend=eager_backend)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def init_graph_buffers(self) -> None:
        self.bufs["kv_last_page_len"].fill_(1)  # ok: FC104
        graph_ws = torch.empty(self.cc.workspace_bytes(), dtype=torch.uint8, device=self.device)
        for bs in self.cc.buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                graph_ws, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.bufs["kv_indptr"][: bs + 1],
                paged_kv_indices_buffer=self.bufs["kv_indices"],
                paged_kv_last_page_len_buffer=self.bufs["kv_last_page_len"][:bs],
            )

    def _plan_args(self):
        c = self.cc
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def fill_host(self, batch: ComponentBatch, rows: int) -> int:
        n = batch.batch_size
        indptr = self.host["kv_indptr"].numpy()
        indptr[0] = 0
        np.cumsum(batch.page_counts_cpu[:n], out=indptr[1 : n + 1])
        indptr[n + 1 : rows + 1] = indptr[n]
        last = self.host["kv_last_page_len"].numpy()
        last[:n] = (batch.seq_lens_cpu[:n] - 1) % self.cc.page_size + 1
        last[n:rows] = 1
        return int(indptr[n])

    def plan_eager(self, batch: ComponentBatch) -> None:
        n = batch.batch_size
        self.fill_host(batch, n)
        self.eager.plan(  # ok: FC102
            self.host["kv_indptr"][: n + 1], batch.kv_indices, self.host["kv_last_page_len"][:n],
            *self._plan_args(), q_data_type=self.cc.dtype,
        )

    def plan_dummy(self, bs: int, num_pages: int) -> None:
        indptr = torch.arange(bs + 1, dtype=torch.int32) * max(num_pages // max(bs, 1), 1)
        last = torch.ones(bs, dtype=torch.int32)
        self.graph_wrappers[bs].plan(indptr, self.bufs["kv_indices"][: int(indptr[-1])], last,
                                     *self._plan_args(), q_data_type=self.cc.dtype)

    def prepare(self, bs: int, batch: ComponentBatch) -> None:
        num = self.fill_host(batch, bs)
        self.bufs["kv_indices"][:num].copy_(batch.kv_indices[:num], non_blocking=True)  # ok: FC104
        if batch.mrope_positions is not None:
            self.bufs["mrope_positions"] = batch.mrope_positions.clone()  # expect: FC107
        self.graph_wrappers[bs].plan(
            self.host["kv_indptr"][: bs + 1], self.bufs["kv_indices"][:num], self.host["kv_last_page_len"][:bs],
            *self._plan_args(), q_data_type=self.cc.dtype,
        )

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        w = self.eager if bs is None else self.graph_wrappers[bs]
        return w.run(q, kv_cache)  # ok: FC108
