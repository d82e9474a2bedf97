"""FlashInfer attention of one colocated tenant.

Each tenant owns its page-table buffers, its decode wrappers (eager and one
graph-mode wrapper per captured bucket) and, for guard tenants, a ragged
prefill wrapper.  Float workspaces come from the tier cache.
"""
from __future__ import annotations

import functools
import logging
from typing import Dict, List, Tuple

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from colo.pools.workspace import get_tenant_workspace
from colo.tenants import StepBatch, TenantKind, TenantSpec

logger = logging.getLogger(__name__)


class TenantAttnBackend:
    def __init__(self, spec: TenantSpec, device: torch.device):
        self.spec = spec
        self.device = device
        self.workspace = get_tenant_workspace(spec.ws_tier, device.index or 0)
        self.prefill_workspace = torch.empty(spec.max_prompt_tokens * spec.num_qo_heads * spec.head_dim * 4, dtype=torch.uint8, device=device)  # ok: FC105
        max_bs = spec.max_batch_size
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(spec.num_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.guard_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.in_graph = False
        self.graph_bs = 0

    # ------------------------------------------------------------------ set-up
    def init_graph_buffers(self) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.kv_indptr.zero_()

    # ------------------------------------------------------------- host tables
    def _fill_host(self, raw_bs: int, bs: int, batch: StepBatch) -> Tuple[int, torch.Tensor]:
        ps = self.spec.page_size
        lens = batch.seq_lens_cpu[:raw_bs]
        self.kv_indptr_host[0] = 0
        torch.cumsum((lens + ps - 1) // ps, 0, out=self.kv_indptr_host[1 : raw_bs + 1])
        self.kv_indptr_host[raw_bs + 1 : bs + 1] = self.kv_indptr_host[raw_bs]
        self.kv_last_page_len_host[:raw_bs] = (lens - 1) % ps + 1
        self.kv_last_page_len_host[raw_bs:bs] = 1
        flat: List[int] = [p for pages in batch.page_lists for p in pages]
        return len(flat), torch.tensor(flat, dtype=torch.int32)

    def _fill_tables(self, bs: int, batch: StepBatch) -> int:
        nnz, flat = self._fill_host(bs, bs, batch)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)
        self.kv_indices[:nnz].copy_(flat, non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_host[:bs], non_blocking=True)
        return nnz

    # ---------------------------------------------------------------- per step
    def init_forward_metadata(self, batch: StepBatch) -> None:
        self.in_graph = False
        s = self.spec
        bs = batch.size
        if s.kind is TenantKind.GUARD:
            self._plan_guard(batch)
            return
        nnz = self._fill_tables(bs, batch)
        self.decode_wrapper.plan(  # expect: FC102
            indptr=self.kv_indptr_host[: bs + 1],
            indices=self.kv_indices[:nnz],
            last_page_len=batch.last_page_len,
            num_qo_heads=s.num_qo_heads,
            num_kv_heads=s.num_kv_heads,
            head_dim=s.head_dim,
            page_size=s.page_size,
            q_data_type=torch.bfloat16,
        )

    def _plan_guard(self, batch: StepBatch) -> None:
        s = self.spec
        plan_ragged = functools.partial(self.guard_wrapper.plan, causal=True, q_data_type=torch.bfloat16)
        plan_ragged(batch.qo_indptr_gpu, batch.qo_indptr_gpu, s.num_qo_heads, s.num_kv_heads, s.head_dim)  # expect: FC102

    # ------------------------------------------------------------- cuda graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        s = self.spec
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_last_page_len_host[:bs] = 1
        w.plan(
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:bs],
            self.kv_last_page_len_host[:bs],
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            s.page_size,
            q_data_type=torch.bfloat16,
        )
        self.graph_wrappers[bs] = w
        self.in_graph = True
        self.graph_bs = bs

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> None:
        s = self.spec
        raw_bs = batch.size
        if max(batch.seq_lens) > s.num_pages * s.page_size:  # expect: FC101
            raise RuntimeError(f"tenant {s.name}: a sequence outgrew the KV pool")
        logger.debug("tenant %s replay bs=%d seq_lens=%s", s.name, bs, batch.seq_lens)  # ok: FC101
        nnz, flat = self._fill_host(raw_bs, bs, batch)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:nnz].copy_(flat, non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_host[:bs], non_blocking=True)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len_host[:bs],
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            s.page_size,
            q_data_type=torch.bfloat16,
        )
        # the pinned mirror's padded tail is rebuilt next step
        self.kv_indptr_host[raw_bs + 1 : bs + 1] = 0  # ok: FC104
        self.in_graph = True
        self.graph_bs = bs

    # ----------------------------------------------------------------- forward
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        w = self.graph_wrappers[self.graph_bs] if self.in_graph else self.decode_wrapper
        return w.run(q, kv_cache)  # ok: FC108

    def forward_guard(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.guard_wrapper.run(q, k, v)  # expect: FC108
