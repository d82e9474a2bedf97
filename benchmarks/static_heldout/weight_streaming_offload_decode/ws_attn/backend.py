"""Attention of the streamed decoder: graph-mode decode per bucket, a sliding-window decode, an eager
trtllm-gen decode for the layers that run outside the graphs, and the prefill wrappers."""

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from wstream import FIXED_WS_BYTES, StreamConfig

_EAGER_WS: Optional[torch.Tensor] = None


def eager_workspace(cfg: StreamConfig, device: torch.device) -> torch.Tensor:
    global _EAGER_WS
    if _EAGER_WS is None:
        _EAGER_WS = torch.empty(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
    return _EAGER_WS


@dataclass
class DecodeBatch:
    batch_size: int
    input_ids: torch.Tensor  # device
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: np.ndarray
    kv_indices: torch.Tensor  # device, packed
    block_tables: torch.Tensor  # device, [bs, max_pages]
    page_counts_cpu: np.ndarray

    @property
    def num_pages(self) -> int:
        return int(self.page_counts_cpu.sum())


class OffloadAttentionBackend:
    def __init__(self, cfg: StreamConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        mb = cfg.max_batch_size
        self.kv_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(mb * cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(mb, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.graph_workspace = torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
            for bs in cfg.buckets
        }
        self.window_decode = BatchDecodeWithPagedKVCacheWrapper(self.graph_workspace, "NHD")
        self.prefill_workspace = torch.zeros(FIXED_WS_BYTES["prefill"], dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        ragged_bytes = cfg.max_prefill_tokens * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 2 + (8 << 20)
        self.ragged_workspace = torch.zeros(ragged_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, "NHD")
        self.eager_seq_lens: Optional[torch.Tensor] = None
        self.eager_block_tables: Optional[torch.Tensor] = None
        self.eager_max_len = 0

    def _heads(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def _fill_host(self, batch: DecodeBatch, rows: int) -> int:
        n = batch.batch_size
        indptr = self.kv_indptr_host.numpy()
        indptr[0] = 0
        np.cumsum(batch.page_counts_cpu[:n], out=indptr[1 : n + 1])
        indptr[n + 1 : rows + 1] = indptr[n]
        last = self.last_page_len_host.numpy()
        last[:n] = (batch.seq_lens_cpu[:n] - 1) % self.cfg.page_size + 1
        last[n:rows] = 1
        return int(indptr[n])

    def plan_prefill(self, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, kv_indices: torch.Tensor,
                     last_page_len_host: torch.Tensor, first_chunk: bool) -> None:
        qo, kv, hd, page = self._heads()
        if first_chunk:
            self.ragged.plan(qo_indptr_host, qo_indptr_host, qo, kv, hd, causal=True, q_data_type=self.cfg.dtype)
        else:
            self.prefill.plan(qo_indptr_host, kv_indptr_host, kv_indices, last_page_len_host, qo, kv, hd, page,
                              causal=True, q_data_type=self.cfg.dtype)

    def plan_capture(self, bs: int) -> None:
        indptr = torch.arange(bs + 1, dtype=torch.int32)
        last = torch.ones(bs, dtype=torch.int32)
        self.graph_wrappers[bs].plan(indptr, self.kv_indices[:bs], last, *self._heads(), q_data_type=self.cfg.dtype)
        self.window_decode.plan(indptr, self.kv_indices[:bs], last, *self._heads(), q_data_type=self.cfg.dtype,
                                window_left=self.cfg.window - 1)

    def plan_window(self, batch: DecodeBatch) -> None:
        n = batch.batch_size
        last = ((batch.seq_lens - 1) % self.cfg.page_size + 1).int()
        self.window_decode.plan(  # expect: FC102
            self.kv_indptr_host[: n + 1], batch.kv_indices, last, *self._heads(),
            q_data_type=self.cfg.dtype, window_left=self.cfg.window - 1,
        )

    def plan_bucket(self, bs: int, batch: DecodeBatch) -> None:
        num = self._fill_host(batch, bs)
        self.kv_indices[:num].copy_(batch.kv_indices[:num], non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices[:num], self.last_page_len_host[:bs], *self._heads(),
            q_data_type=self.cfg.dtype,
        )
        self.plan_window(batch)

    def plan_eager(self, batch: DecodeBatch) -> None:
        self.eager_seq_lens = batch.seq_lens
        self.eager_block_tables = batch.block_tables
        self.eager_max_len = int(batch.seq_lens_cpu[: batch.batch_size].max())

    def eager_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, window_left: int) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=eager_workspace(self.cfg, self.device),
            block_tables=self.eager_block_tables,
            seq_lens=self.eager_seq_lens,
            max_seq_len=self.eager_max_len,
            bmm1_scale=self.cfg.head_dim**-0.5,
            bmm2_scale=1.0,
            window_left=window_left,
        )
