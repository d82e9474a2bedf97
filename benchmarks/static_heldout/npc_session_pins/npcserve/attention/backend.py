"""FlashInfer attention for NPC sessions.

Decode ticks replay graphs per bucket; each graph-mode wrapper is bound to one shared page table
(`kv_indptr` / `kv_indices` / `kv_last_page_len`). Ticks larger than the biggest bucket plan an
eager wrapper. New lines are prefilled through a paged prefill wrapper over persona + dialogue pages,
greetings (a session's very first line) through a ragged wrapper.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Tuple

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

logger = logging.getLogger(__name__)

GREETING_WORKSPACE_BYTES = 64 * 1024 * 1024


class SessionOverflow(RuntimeError):
    pass


class NPCAttnBackend:
    _kv_layout = "NHD"

    def __init__(self, cfg, table, device: torch.device):
        self.cfg = cfg
        self.table = table
        self.device = device
        max_rows = cfg.graph_max_bs
        max_nnz = cfg.max_active * cfg.max_pages_per_session
        # page table shared by every graph-mode decode wrapper
        self.kv_indptr = torch.zeros(max_rows + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_nnz, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_rows, dtype=torch.int32, device=device)
        # pinned host mirrors, filled with numpy
        self.kv_indptr_host = torch.zeros(cfg.max_active + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_host = torch.zeros(max_nnz, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(cfg.max_active, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_np = self.kv_indptr_host.numpy()
        self.kv_indices_np = self.kv_indices_host.numpy()
        self.kv_last_page_len_np = self.kv_last_page_len_host.numpy()
        self.persona_indptr_host = torch.zeros(cfg.max_active + 1, dtype=torch.int32, pin_memory=True)
        # eager page table for ticks past the largest bucket
        self.eager_kv_indptr = torch.zeros(cfg.max_active + 1, dtype=torch.int32, device=device)
        self.eager_kv_indices = torch.zeros(max_nnz, dtype=torch.int32, device=device)
        self.pages_in_flight = 0

        self.decode_backend = "trtllm-gen" if cfg.use_trtllm_decode else "fa2"
        self.decode_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.greet_workspace = torch.zeros(GREETING_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106

        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, self._kv_layout, use_tensor_cores=True, backend=self.decode_backend
        )
        self.persona_decode = BatchDecodeWithPagedKVCacheWrapper(
            self.prefill_workspace, self._kv_layout, use_tensor_cores=True, backend="fa2"
        )
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout, backend="fa2")
        self.greet = BatchPrefillWithRaggedKVCacheWrapper(self.greet_workspace, self._kv_layout, backend="fa2")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._last_plan_key: Dict[int, Tuple[int, int]] = {}
        self.kv_cache: List[torch.Tensor] = []

    # ------------------------------------------------------------------ set-up
    def allocate_kv_cache(self) -> None:
        shape = (self.cfg.num_pages, 2, self.cfg.page_size, self.cfg.num_kv_heads, self.cfg.head_dim)
        self.kv_cache = [torch.empty(shape, dtype=torch.bfloat16, device=self.device) for _ in range(self.cfg.num_layers)]

    def init_graph_buffers(self) -> None:
        self.kv_indptr.zero_()
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def make_graph_wrapper(self, bucket: int, workspace: torch.Tensor) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            workspace,
            self._kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bucket + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bucket],
            backend=self.decode_backend,
        )
        self.graph_wrappers[bucket] = w
        return w

    def warmup_greeting_kernel(self) -> bool:
        """Compile the ragged prefill module at start-up so the first greeting is not slow."""
        compiled = getattr(self.greet, "_cached_module", None) is not None  # expect: FC103
        if not compiled:
            qo = torch.tensor([0, 8], dtype=torch.int32)
            self.greet.plan(qo, qo, self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, causal=True)
        return compiled

    # ------------------------------------------------------------ page tables
    def _stage_page_table(self, rows: np.ndarray, pad_to: int) -> int:
        pages = [self.table.page_list(int(r)) for r in rows]
        n = len(pages)
        counts = np.fromiter((len(p) for p in pages), dtype=np.int32, count=n)
        self.kv_indptr_np[0] = 0
        np.cumsum(counts, out=self.kv_indptr_np[1 : n + 1])
        self.kv_indptr_np[n + 1 : pad_to + 1] = self.kv_indptr_np[n]
        nnz = int(self.kv_indptr_np[n])
        if n:
            self.kv_indices_np[:nnz] = np.concatenate(pages)
        self.kv_last_page_len_np[:n] = [self.table.last_page_len(int(r)) for r in rows]
        self.kv_last_page_len_np[n:pad_to] = 1
        self.pages_in_flight = nnz
        return nnz

    def plan_graph_decode(self, bucket: int, rows: np.ndarray) -> None:
        nnz = self._stage_page_table(rows, pad_to=bucket)
        self.kv_indptr[: bucket + 1].copy_(self.kv_indptr_host[: bucket + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:nnz].copy_(self.kv_indices_host[:nnz], non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[bucket]
        key = (len(rows), nnz)
        if self._last_plan_key.get(bucket) == key and w._plan_info is not None:  # expect: FC103
            return
        w.plan(  # ok: FC102
            self.kv_indptr_host[: bucket + 1],
            self.kv_indices_host[:nnz],
            self.kv_last_page_len_host[:bucket],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=torch.bfloat16,
        )
        self._last_plan_key[bucket] = key

    def plan_eager_decode(self, batch) -> None:
        if (batch.seq_lens_device >= self.cfg.max_context).any():  # expect: FC101
            raise SessionOverflow("a session ran past max_context")
        bs = batch.size
        nnz = self._stage_page_table(batch.rows, pad_to=bs)
        if nnz > self.eager_kv_indices.numel():
            self.eager_kv_indices = torch.empty(2 * nnz, dtype=torch.int32, device=self.device)  # expect: FC107
        self.eager_kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)
        self.eager_kv_indices[:nnz].copy_(self.kv_indices_host[:nnz], non_blocking=True)
        self.eager_decode.plan(self.eager_kv_indptr[: bs + 1], self.eager_kv_indices[:nnz], self.kv_last_page_len_host[:bs],  # expect: FC102
                               self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size,
                               q_data_type=torch.bfloat16)

    def plan_persona_recall(self, rows: np.ndarray) -> None:
        counts = np.fromiter((len(self.table.by_row[int(r)].persona_pages) for r in rows), dtype=np.int32, count=len(rows))
        indptr = self.persona_indptr_host.numpy()
        indptr[0] = 0
        np.cumsum(counts, out=indptr[1 : len(rows) + 1])
        nnz = int(indptr[len(rows)])
        indices = torch.from_numpy(np.concatenate([self.table.by_row[int(r)].persona_pages for r in rows]))
        last = torch.full((len(rows),), self.cfg.page_size, dtype=torch.int32)
        self.persona_decode.plan(self.persona_indptr_host[: len(rows) + 1], indices[:nnz], last,
                                 self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size,
                                 q_data_type=torch.bfloat16)

    # ------------------------------------------------------------------ prefill
    def prefill_new_sessions(self, lines: List[Tuple[int, List[int]]], model) -> torch.Tensor:
        rows = np.asarray([r for r, _ in lines], dtype=np.int64)
        qo_lens = np.asarray([len(t) for _, t in lines], dtype=np.int32)
        qo_indptr_np = np.zeros(len(lines) + 1, dtype=np.int32)
        np.cumsum(qo_lens, out=qo_indptr_np[1:])
        qo_indptr_gpu = torch.from_numpy(qo_indptr_np).to(self.device, non_blocking=True)
        nnz = self._stage_page_table(rows, pad_to=len(lines))
        kv_indices_gpu = self.kv_indices_host[:nnz].to(self.device, non_blocking=True)
        fresh = [i for i, r in enumerate(rows.tolist()) if self.table.context_lens_np[r] == 0]
        if fresh and len(fresh) == len(lines):
            qo_host = torch.from_numpy(qo_indptr_np)
            self.greet.plan(qo_host, qo_host, self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, causal=True)  # ok: FC102
            return model.forward_greeting(lines, qo_indptr_gpu)
        self.prefill.plan(qo_indptr_gpu, self.kv_indptr_host[: len(lines) + 1], kv_indices_gpu,  # expect: FC102
                          self.kv_last_page_len_host[: len(lines)], self.cfg.num_qo_heads, self.cfg.num_kv_heads,
                          self.cfg.head_dim, self.cfg.page_size, causal=True, q_data_type=torch.bfloat16)
        return model.forward_prefill(lines, qo_indptr_gpu)

    # ------------------------------------------------------------------ forward
    def forward_decode(self, q: torch.Tensor, layer_id: int, bucket=None) -> torch.Tensor:
        kv = self.kv_cache[layer_id]
        if self.cfg.persona_recall_every and layer_id % self.cfg.persona_recall_every == 0:
            return self.persona_decode.run(q, kv)  # expect: FC108
        w = self.graph_wrappers[bucket] if bucket is not None else self.eager_decode
        return w.run(q, kv)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.prefill.run(q, self.kv_cache[layer_id])

    def forward_greeting(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.greet.run(q, k, v)
