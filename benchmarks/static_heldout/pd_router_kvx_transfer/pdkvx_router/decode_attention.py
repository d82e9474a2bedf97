"""Decode-side attention: graph-mode decode wrappers per bucket over shared max-size buffers, an eager
overflow wrapper, a sliding-window wrapper for the local layers, trtllm-gen decode for long contexts."""
from __future__ import annotations

import bisect
import functools
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from pdkvx.config import PDConfig
from pdkvx.utils import pages_and_last_len


class DecodeAttention:
    def __init__(self, cfg: PDConfig, device: torch.device):
        self.cfg, self.device, self.page_size = cfg, device, cfg.page_size
        m = cfg.model
        self.num_qo_heads, self.num_kv_heads, self.head_dim = m.num_qo_heads, m.num_kv_heads, m.head_dim
        self.sm_scale = m.head_dim ** -0.5
        self.buckets: List[int] = sorted(cfg.graph_buckets)
        self.window_layer_set = frozenset(m.window_layers)

        self.decode_workspace = torch.zeros(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.eager_workspace = torch.zeros(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)
        self.trt_workspace = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105

        self.init_decode_buffers()

        self.overflow_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD", use_tensor_cores=True)
        self._overflow_plan = functools.partial(
            self.overflow_decode.plan, num_qo_heads=self.num_qo_heads, num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim, page_size=self.page_size, q_data_type=torch.bfloat16,
        )
        self.window_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD", use_tensor_cores=True)
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.init_graph_wrappers()

        self.active_bucket: Optional[int] = None
        self.packed_tail = 0
        self.max_seq_len_host = 0
        self.long_context_active = False

    def init_decode_buffers(self) -> None:
        max_bs = self.cfg.max_decode_batch
        max_pages = max_bs * self.cfg.max_pages_per_seq
        dev = self.device
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=dev)
        self.kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=dev)
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.seq_lens_gpu = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.out_page_gpu = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.out_off_gpu = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.block_table_gpu = torch.zeros((max_bs, self.cfg.max_pages_per_seq), dtype=torch.int32, device=dev)

        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.seq_lens_cpu = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        self.out_slot_cpu = torch.zeros((2, max_bs), dtype=torch.int64, pin_memory=True)
        self.kv_indptr_np = self.kv_indptr_cpu.numpy()
        self.kv_indices_np = self.kv_indices_cpu.numpy()
        self.last_len_np = self.kv_last_page_len_cpu.numpy()
        self.seq_lens_np = self.seq_lens_cpu.numpy()
        self.out_slot_np = self.out_slot_cpu.numpy()
        self.block_table_np = np.zeros((max_bs, self.cfg.max_pages_per_seq), dtype=np.int32)

    def init_graph_wrappers(self) -> None:
        for bs in self.buckets:
            self.graph_decode[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def bucket_for(self, bs: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, bs)
        return self.buckets[i] if i < len(self.buckets) else None

    def prepare_decode(self, rows_cpu: List[int], seq_lens_np: np.ndarray) -> int:
        """Fill the host mirrors, copy them into the graph-bound buffers and plan."""
        bs = len(rows_cpu)
        bucket = self.bucket_for(bs)
        padded = bs if bucket is None else bucket
        page = self.page_size

        num_pages = (seq_lens_np + page - 1) // page
        self.kv_indptr_np[0] = 0
        np.cumsum(num_pages, out=self.kv_indptr_np[1 : bs + 1])
        self.kv_indptr_np[bs + 1 : padded + 1] = self.kv_indptr_np[bs]
        self.last_len_np[:bs] = seq_lens_np - (num_pages - 1) * page
        self.last_len_np[bs:padded] = 1
        self.seq_lens_np[:bs] = seq_lens_np
        total = int(self.kv_indptr_cpu[bs])  # ok: FC101
        if total:
            self.kv_indices_np[:total] = np.concatenate([self.block_table_np[r, :n] for r, n in zip(rows_cpu, num_pages)])
        # slot of the token this step writes: last page, offset last_len - 1
        last_page_idx = self.kv_indptr_np[1 : bs + 1] - 1
        self.out_slot_np[0, :bs] = self.kv_indices_np[last_page_idx]
        self.out_slot_np[1, :bs] = self.last_len_np[:bs] - 1
        self.packed_tail = total
        self.max_seq_len_host = int(seq_lens_np.max()) if bs else 0

        self.seq_lens_gpu[:bs].copy_(self.seq_lens_cpu[:bs], non_blocking=True)
        self.out_page_gpu[:bs].copy_(self.out_slot_cpu[0, :bs], non_blocking=True)
        self.out_off_gpu[:bs].copy_(self.out_slot_cpu[1, :bs], non_blocking=True)

        self._plan_window(bs, total)
        if bucket is None:
            self.active_bucket = None
            self._plan_overflow(bs, total)
            return bs

        self.active_bucket = bucket
        self.kv_indptr[: padded + 1].copy_(self.kv_indptr_cpu[: padded + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:total].copy_(self.kv_indices_cpu[:total], non_blocking=True)
        w = self.graph_decode[bucket]
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: padded + 1], self.kv_indices_cpu[:total], self.kv_last_page_len_cpu[:padded],
            self.num_qo_heads, self.num_kv_heads, self.head_dim, page, q_data_type=torch.bfloat16,
        )
        # padded rows read one page of length one
        self.kv_last_page_len[bs:padded].fill_(1)  # expect: FC104
        return padded

    def _plan_window(self, bs: int, total: int) -> None:
        if not self.window_layer_set:
            return
        self.window_decode.plan(
            self.kv_indptr_cpu[: bs + 1], self.kv_indices_cpu[:total], self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size,
            window_left=self.cfg.model.sliding_window - 1, q_data_type=torch.bfloat16,
        )

    def _plan_overflow(self, bs: int, total: int) -> None:
        seq_lens_gpu = self.seq_lens_gpu[:bs]
        _, last_len_gpu = pages_and_last_len(seq_lens_gpu, self.page_size)
        self._overflow_plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices_cpu[:total], last_len_gpu)  # expect: FC102

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor) -> None:
        n = k.shape[0]
        page, off = self.out_page_gpu[:n], self.out_off_gpu[:n]
        kv_cache[page, 0, off] = k
        kv_cache[page, 1, off] = v

    def forward_decode(self, layer_id: int, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if layer_id in self.window_layer_set:
            return self.window_decode.run(q, kv_cache)  # expect: FC108
        if self.long_context_active:
            return self._trtllm_decode(q, kv_cache)
        w = self.overflow_decode if self.active_bucket is None else self.graph_decode[self.active_bucket]
        return w.run(q, kv_cache)  # ok: FC108

    def _trtllm_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        n = q.shape[0]
        return trtllm_batch_decode_with_kv_cache(
            query=q, kv_cache=kv_cache, workspace_buffer=self.trt_workspace,
            block_tables=self.block_table_gpu[:n], seq_lens=self.seq_lens_gpu[:n],
            max_seq_len=self.max_seq_len_host, bmm1_scale=self.sm_scale, bmm2_scale=1.0,
        )
