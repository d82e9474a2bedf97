"""FlashInfer attention for dense and routed blocks.

Two page pools: every token writes KV for the dense blocks; only routed tokens write KV for the
routed blocks, so the routed blocks have their own page table (``routed_*``) with shorter rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from modserve.config import MoDConfig, PREFILL_WORKSPACE_BYTES


@dataclass
class DecodeBatch:
    bs: int
    seq_lens: torch.Tensor               # device
    kv_indptr_cpu: torch.Tensor          # pinned
    kv_indices: torch.Tensor             # device
    kv_last_page_len_cpu: torch.Tensor   # pinned
    routed_lens: torch.Tensor            # device, routed tokens per request
    routed_indptr_cpu: torch.Tensor      # pinned
    routed_kv_indices: torch.Tensor      # device
    routed_last_page_len: torch.Tensor   # device
    routed_last_page_len_cpu: torch.Tensor
    block_tables: Optional[torch.Tensor] = None


@dataclass
class PrefillChunk:
    num_tokens: int
    qo_indptr_cpu: torch.Tensor
    qo_indptr_gpu: torch.Tensor
    routed_qo_indptr_cpu: torch.Tensor


class MoDAttnBackend:
    def __init__(self, cfg: MoDConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.decode_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_workspace = torch.empty(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.trtllm_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.ragged_prefill = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.eager_full = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", use_tensor_cores=True, backend="fa2")  # ok: FC105
        self.eager_routed = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", use_tensor_cores=True)

        max_bs = cfg.max_batch
        max_pages = max_bs * cfg.max_pages_per_seq
        self.full_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.full_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.full_last_page = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.routed_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.routed_kv_indices = torch.zeros(max_pages // 4, dtype=torch.int32, device=device)
        self.routed_last_page = torch.ones(max_bs, dtype=torch.int32, device=device)
        # pinned mirrors handed to plan()
        self.full_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.full_last_page_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.routed_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.routed_last_page_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.graph_full: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_routed: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_bs: Optional[int] = None
        self.capture_max_seq_len = cfg.max_seq_len
        self.block_tables: Optional[torch.Tensor] = None
        self.seq_lens: Optional[torch.Tensor] = None

    # ---- set-up -------------------------------------------------------------------------------
    def init_cuda_graph_state(self) -> None:
        self.full_last_page.fill_(1)  # ok: FC104
        for bs in self.cfg.graph_batch_sizes:
            self.graph_full[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.full_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.full_kv_indices,
                paged_kv_last_page_len_buffer=self.full_last_page[:bs],
            )
            self.graph_routed[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.routed_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.routed_kv_indices,
                paged_kv_last_page_len_buffer=self.routed_last_page[:bs],
            )

    def _plan_kwargs(self) -> dict:
        return dict(
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim,
            page_size=self.cfg.page_size,
            q_data_type=torch.bfloat16,
        )

    # ---- eager steps --------------------------------------------------------------------------
    def plan_prefill_chunk(self, chunk: PrefillChunk) -> None:
        c = self.cfg
        self.ragged_prefill.plan(chunk.qo_indptr_gpu, chunk.qo_indptr_gpu, c.num_qo_heads, c.num_kv_heads, c.head_dim, causal=True)  # expect: FC102

    def _routed_indptr_device(self, batch: DecodeBatch) -> torch.Tensor:
        pages = (batch.routed_lens + self.cfg.page_size - 1) // self.cfg.page_size
        indptr = torch.zeros(batch.bs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(pages, 0, out=indptr[1:])
        return indptr

    def init_forward_metadata(self, batch: DecodeBatch) -> None:
        """Eager decode: plan the dense and the routed wrapper for this step."""
        self.graph_bs = None
        n = batch.bs
        self.block_tables = batch.block_tables
        self.seq_lens = batch.seq_lens
        self.eager_full.plan(
            batch.kv_indptr_cpu[: n + 1],  # ok: FC102
            batch.kv_indices,
            batch.kv_last_page_len_cpu[:n],
            **self._plan_kwargs(),
        )
        routed_indptr = self._routed_indptr_device(batch)
        self.eager_routed.plan(routed_indptr, batch.routed_kv_indices, batch.routed_last_page_len, **self._plan_kwargs())  # expect: FC102

    # ---- graph steps --------------------------------------------------------------------------
    def plan_for_capture(self, bs: int, batch: DecodeBatch) -> None:
        self.graph_bs = bs
        self.graph_full[bs].plan(self.full_kv_indptr_cpu[: bs + 1], self.full_kv_indices, self.full_last_page_cpu[:bs], **self._plan_kwargs())
        self.graph_routed[bs].plan(self.routed_kv_indptr_cpu[: bs + 1], self.routed_kv_indices, self.routed_last_page_cpu[:bs], **self._plan_kwargs())

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: DecodeBatch) -> None:
        self.graph_bs = bs
        n = batch.bs
        self.full_kv_indptr_cpu[: n + 1].copy_(batch.kv_indptr_cpu[: n + 1])
        self.full_kv_indptr_cpu[n + 1 : bs + 1] = self.full_kv_indptr_cpu[n]
        self.full_last_page_cpu[:n].copy_(batch.kv_last_page_len_cpu[:n])
        self.routed_kv_indptr_cpu[: n + 1].copy_(batch.routed_indptr_cpu[: n + 1])
        self.routed_kv_indptr_cpu[n + 1 : bs + 1] = self.routed_kv_indptr_cpu[n]
        self.routed_last_page_cpu[:n].copy_(batch.routed_last_page_len_cpu[:n])

        nnz = int(self.full_kv_indptr_cpu[bs])  # ok: FC101
        routed_nnz = int(self.routed_kv_indptr_cpu[bs])
        if routed_nnz > self.routed_kv_indices.numel():
            self.routed_kv_indices = torch.empty(routed_nnz * 2, dtype=torch.int32, device=self.device)  # expect: FC107
        self.full_kv_indptr[: bs + 1].copy_(self.full_kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.full_kv_indices[:nnz].copy_(batch.kv_indices[:nnz], non_blocking=True)
        self.routed_kv_indptr[: bs + 1].copy_(self.routed_kv_indptr_cpu[: bs + 1], non_blocking=True)
        self.routed_kv_indices[:routed_nnz].copy_(batch.routed_kv_indices[:routed_nnz], non_blocking=True)  # ok: FC104

        self.graph_full[bs].plan(
            self.full_kv_indptr_cpu[: bs + 1],  # ok: FC102
            self.full_kv_indices,
            self.full_last_page_cpu[:bs],
            **self._plan_kwargs(),
        )
        self.graph_routed[bs].plan(self.routed_kv_indptr_cpu[: bs + 1], self.routed_kv_indices, self.routed_last_page_cpu[:bs], **self._plan_kwargs())
        # padded rows attend to one slot of the null page
        self.routed_last_page[n:bs].fill_(1)  # expect: FC104
        self.full_last_page[:n].copy_(self.full_last_page_cpu[:n], non_blocking=True)  # expect: FC104

    # ---- kernels ------------------------------------------------------------------------------
    def decode_dense(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.cfg.use_trtllm_decode and self.graph_bs is None:
            scale = self.cfg.head_dim ** -0.5
            return trtllm_batch_decode_with_kv_cache(q, kv_cache, self.trtllm_workspace, self.block_tables, self.seq_lens, self.cfg.max_seq_len, scale, 1.0)
        w = self.graph_full[self.graph_bs] if self.graph_bs is not None else self.eager_full
        return w.run(q, kv_cache)  # ok: FC108

    def decode_routed(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        # the routed rows change every step, so the routed blocks always run the eager plan
        return self.eager_routed.run(q, kv_cache)  # expect: FC108

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged_prefill.run(q, k, v)
