"""Attention for multi-LoRA serving: per-adapter prefix-tuning wrappers and graph buckets keyed by
(batch size, number of active adapters)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)

from .constants import MAX_LORAS, WsSize
from .registry import register_lora_backend

logger = logging.getLogger(__name__)


@dataclass
class LoraBatch:
    num_reqs: int
    adapter_ids: torch.Tensor  # device, one per request
    adapter_ids_np: np.ndarray
    kv_indptr_np: np.ndarray
    kv_indices: torch.Tensor
    last_page_len_np: np.ndarray


@dataclass
class AttnDims:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_num_tokens: int = 8192
    max_bs: int = 256
    max_pages: int = 1 << 16


@register_lora_backend("flashinfer")
class LoraAttnBackend:
    WORKSPACE_FLOOR = 16 << 20

    def __init__(self, dims: AttnDims, device: torch.device) -> None:
        self.dims = dims
        self.device = device
        self.decode_ws = torch.zeros(WsSize.DECODE, dtype=torch.uint8, device=device)  # expect: FC106
        prefix_bytes = max(self.WORKSPACE_FLOOR, dims.max_num_tokens * dims.num_qo_heads * 256)
        self.prefix_ws = torch.zeros(prefix_bytes, dtype=torch.uint8, device=device)  # ok: FC106

        self.kv_indptr_buf = torch.zeros(dims.max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(dims.max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(dims.max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(dims.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(dims.max_bs, dtype=torch.int32, pin_memory=True)
        self.seg_indptr = torch.zeros(MAX_LORAS + 1, dtype=torch.int32, device=device)
        self.seg_lens_host: Optional[torch.Tensor] = None

        # one row per adapter slot: the adapter's prefix-tuning KV pages
        self.adapter_kv_indptr = torch.zeros(MAX_LORAS, 2, dtype=torch.int32, device=device)
        self.adapter_kv_indptr_host = torch.zeros(MAX_LORAS, 2, dtype=torch.int32, pin_memory=True)
        self.adapter_prefill: dict[int, BatchPrefillWithRaggedKVCacheWrapper] = {
            slot: BatchPrefillWithRaggedKVCacheWrapper(self.prefix_ws, "NHD") for slot in range(MAX_LORAS)
        }
        self.adapter_decode: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            slot: BatchDecodeWithPagedKVCacheWrapper(self.prefix_ws, "NHD") for slot in range(MAX_LORAS)
        }
        self.bucket_wrappers: dict[tuple[int, int], CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}

    def add_bucket(self, bs: int, num_adapters: int) -> None:
        self.bucket_wrappers[(bs, num_adapters)] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            self.decode_ws,
            self.kv_indptr_buf[: bs + 1],
            self.kv_indices_buf,
            self.last_page_len_buf[:bs],
            "NHD",
        )

    # ------------------------------------------------------------ per step
    def update_for_step(self, batch: LoraBatch) -> int:
        d = self.dims
        seg_lens = torch.bincount(batch.adapter_ids, minlength=MAX_LORAS)
        num_active = int((seg_lens > 0).sum())  # expect: FC101
        active_np = np.flatnonzero(np.bincount(batch.adapter_ids_np, minlength=MAX_LORAS))  # ok: FC101
        self.seg_lens_host = torch.zeros(MAX_LORAS, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.seg_lens_host[: len(active_np)] = torch.from_numpy(active_np.astype(np.int32))
        torch.cumsum(seg_lens, 0, out=self.seg_indptr[1:])  # ok: FC104
        for slot in torch.unique(batch.adapter_ids):  # expect: FC101
            logger.debug("adapter slot %s active", slot)
        for slot in active_np.tolist():  # ok: FC101
            self.adapter_decode[slot].plan(  # expect: FC102
                self.adapter_kv_indptr[slot],
                self.kv_indices_buf,
                self.last_page_len_host[:1],
                d.num_qo_heads, d.num_kv_heads, d.head_dim, d.page_size,
            )
            self.adapter_prefill[slot].plan(  # ok: FC102
                self.adapter_kv_indptr_host[slot],
                self.adapter_kv_indptr_host[slot],
                d.num_qo_heads, d.num_kv_heads, d.head_dim,
            )
        return num_active

    def prepare_bucket(self, bs: int, num_adapters: int, batch: LoraBatch) -> None:
        d = self.dims
        w = self.bucket_wrappers[(bs, num_adapters)]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError("bucket wrapper does not match its batch size")
        n = batch.num_reqs
        self.kv_indptr_host[: n + 1] = torch.from_numpy(batch.kv_indptr_np)
        self.kv_indptr_host[n + 1 : bs + 1] = int(batch.kv_indptr_np[-1])  # ok: FC101
        self.last_page_len_host[:n] = torch.from_numpy(batch.last_page_len_np)
        nnz = int(batch.kv_indptr_np[-1])
        self.kv_indices_buf[:nnz].copy_(batch.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        w.plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices_buf,
            self.last_page_len_host[:bs],
            d.num_qo_heads, d.num_kv_heads, d.head_dim, d.page_size,
        )

    # ------------------------------------------------------------ forward
    def forward_bucket(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int, num_adapters: int) -> torch.Tensor:
        return self.bucket_wrappers[(bs, num_adapters)].run(q, kv_cache)  # ok: FC108

    def forward_adapter_prefix(self, q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor,
                               slot: int) -> torch.Tensor:
        return self.adapter_prefill[slot].run(q, prefix_k, prefix_v)  # expect: FC108

    def lora_segments(self, adapter_ids: torch.Tensor, n: int) -> torch.Tensor:
        """Segment offsets for the punica SGMV kernel, written into spare device memory."""
        seg_lens = torch.bincount(adapter_ids, minlength=n)
        torch.cumsum(seg_lens, 0, out=self.kv_indptr_buf[1 : n + 1])  # expect: FC104
        return self.kv_indptr_buf[: n + 1]
