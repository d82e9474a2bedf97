"""Temporal transformer attention: one decode query per session per frame over its ring of frame pages."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from duplex.sessions import SessionTable
from duplex.settings import DuplexSettings


class TemporalAttnState:
    def __init__(self, settings: DuplexSettings, sessions: SessionTable, device: torch.device):
        self.settings = settings
        self.sessions = sessions
        self.device = device
        self.workspace = torch.empty(settings.temporal_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        max_bs = max(settings.graph_buckets)
        P = settings.pages_per_session
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * P, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        # sessions beyond the largest bucket run eagerly; the page gather reads this indptr on the device
        self.eager_indptr_gpu = torch.zeros(settings.max_sessions + 1, dtype=torch.int32, device=device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True, backend="fa2")
        self.current: Optional[BatchDecodeWithPagedKVCacheWrapper] = None

    def _plan_kwargs(self) -> dict:
        s = self.settings
        return dict(
            num_qo_heads=s.temporal_heads,
            num_kv_heads=s.temporal_kv_heads,
            head_dim=s.head_dim,
            page_size=s.page_size,
            q_data_type=torch.bfloat16,
        )

    def bind_bucket(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            backend="fa2",
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = w
        self.current = w
        return w

    def plan_frame(self, bs: int, slots_np: np.ndarray) -> None:
        indptr, indices, last = self.sessions.page_lists(slots_np)
        self.kv_indptr_host.numpy()[: bs + 1] = indptr
        self.last_page_host.numpy()[:bs] = last
        self.kv_indices[: len(indices)].copy_(torch.from_numpy(indices), non_blocking=True)
        w = self.graph_wrappers[bs]
        w.plan(self.kv_indptr_host[: bs + 1], self.kv_indices, self.last_page_host[:bs], **self._plan_kwargs())  # ok: FC102
        self.current = w

    def plan_eager(self, slots_np: np.ndarray) -> None:
        n = len(slots_np)
        indptr, indices, last = self.sessions.page_lists(slots_np)
        self.eager_indptr_gpu[: n + 1].copy_(torch.from_numpy(indptr), non_blocking=True)
        self.eager.plan(  # expect: FC102
            self.eager_indptr_gpu[: n + 1],
            torch.from_numpy(indices).to(self.device, non_blocking=True),
            torch.from_numpy(last),
            **self._plan_kwargs(),
        )
        self.current = self.eager

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.current.run(q, kv_cache)  # ok: FC108
