"""Attention of the offline server.

Prefill: one graph-mode paged prefill wrapper per padded length over shared bound buffers; prompts past
the largest padded length go through an eager paged wrapper. Decode: a graph-mode trtllm-gen wrapper over
its own bound buffers (XQA when the KV cache is fp8). Refills of finished rows: a POD wrapper that runs
the new rows' prefill and the old rows' decode in one launch.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPODWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
)
from flashinfer.decode import xqa_batch_decode_with_kv_cache

from bapi.config import OfflineConfig
from bapi.padding import last_page_lens
from bapi_runtime.metadata import DecodeMetadata, StaticBatchMetadata

_PREFILL_WS_MB = {"fa2": 512, "fa3": 768}


def make_workspace(nbytes: int, device: torch.device, zeroed: bool = True) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        buf.zero_()
    return buf


class OfflineAttention:
    def __init__(self, cfg: OfflineConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        rows, ppr = cfg.batch_rows, cfg.pages_per_row
        self.heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim)
        self.graph_ws = torch.zeros(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)
        self.prefill_ws = torch.zeros(_PREFILL_WS_MB[cfg.prefill_backend] << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.decode_ws = make_workspace(cfg.decode_workspace_bytes(), device)
        xqa_ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        xqa_ws.zero_()
        self.xqa_ws = xqa_ws

        # prefill graphs: qo_indptr per padded length (rows of equal length), the rest shared
        self.qo_indptr: Dict[int, torch.Tensor] = {
            L: torch.arange(0, (rows + 1) * L, L, dtype=torch.int32, device=device) for L in cfg.padded_lengths
        }
        self.kv_indptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(rows * ppr, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(rows, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(rows + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(rows * ppr, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(rows, dtype=torch.int32, pin_memory=True)
        self.host_mirrors = [self.kv_indptr_cpu, self.kv_indices_cpu, self.last_page_len_cpu]
        self.bound_buffers = [self.kv_indptr, self.kv_indices, self.last_page_len]
        self.prefill_graph: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {
            L: BatchPrefillWithPagedKVCacheWrapper(
                self.graph_ws, "HND", use_cuda_graph=True, qo_indptr_buf=self.qo_indptr[L],
                paged_kv_indptr_buf=self.kv_indptr, paged_kv_indices_buf=self.kv_indices,
                paged_kv_last_page_len_buf=self.last_page_len, backend="fa2",
            )
            for L in cfg.padded_lengths
        }
        self.overflow_prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "HND", backend="fa2")

        self.dec_kv_indptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.dec_kv_indices = torch.zeros(rows * ppr, dtype=torch.int32, device=device)
        self.dec_last_page_len = torch.ones(rows, dtype=torch.int32, device=device)
        self.decode_graph = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_ws, "HND", use_cuda_graph=True, paged_kv_indptr_buffer=self.dec_kv_indptr,
            paged_kv_indices_buffer=self.dec_kv_indices, paged_kv_last_page_len_buffer=self.dec_last_page_len,
            backend="trtllm-gen",
        )
        self.pod = BatchPODWithPagedKVCacheWrapper(self.prefill_ws, "HND")
        # static page table: row r owns pages [r * ppr, (r + 1) * ppr)
        self.page_table_np = np.arange(rows * ppr, dtype=np.int32).reshape(rows, ppr)
        self.block_tables = torch.from_numpy(self.page_table_np).to(device)
        self.out_slots = torch.zeros(rows * cfg.max_prompt_len, dtype=torch.int64, device=device)
        self.dec_seq_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.padded_len: Optional[int] = None
        self.n_out = 0
        self.dec_max_len = 0

    def _pack_indices(self, pages: np.ndarray) -> int:
        rows = pages.shape[0]
        self.kv_indptr_cpu.numpy()[0] = 0
        np.cumsum(pages, out=self.kv_indptr_cpu.numpy()[1 : rows + 1])
        total = int(self.kv_indptr_cpu[rows])
        self.kv_indices_cpu.numpy()[:total] = np.concatenate([self.page_table_np[r, :n] for r, n in enumerate(pages)])
        return total

    def init_forward_metadata(self, md: StaticBatchMetadata) -> None:
        rows, L, ps = md.rows, md.padded_len, self.cfg.page_size
        self.padded_len = L
        self.n_out = md.num_tokens
        self.out_slots[: self.n_out].copy_(md.out_slots)
        if L is None:
            self._plan_overflow(md)
            return
        pages, last = last_page_lens(md.seq_lens_cpu.clamp(min=L), ps)
        total = self._pack_indices(pages.numpy())
        self.last_page_len_cpu[:rows].copy_(last)
        self.kv_indptr[: rows + 1].copy_(self.kv_indptr_cpu[: rows + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:total].copy_(self.kv_indices_cpu[:total], non_blocking=True)
        self.last_page_len[:rows].copy_(self.last_page_len_cpu[:rows], non_blocking=True)
        self.prefill_graph[L].plan(  # ok: FC102
            md.qo_indptr_cpu, self.kv_indptr_cpu[: rows + 1], self.kv_indices_cpu[:total], self.last_page_len_cpu[:rows],
            *self.heads, ps, causal=True, q_data_type=torch.bfloat16,
        )

    def _plan_overflow(self, md: StaticBatchMetadata) -> None:
        pages_cpu, _ = last_page_lens(md.seq_lens_cpu, self.cfg.page_size)
        total = self._pack_indices(pages_cpu.numpy())
        _, last_gpu = last_page_lens(md.seq_lens, self.cfg.page_size)
        self.overflow_prefill.plan(  # expect: FC102
            md.qo_indptr_cpu, self.kv_indptr_cpu[: md.rows + 1], self.kv_indices_cpu[:total], last_gpu,
            *self.heads, self.cfg.page_size, causal=True, q_data_type=torch.bfloat16,
        )

    def init_forward_metadata_decode(self, dmd: DecodeMetadata) -> None:
        rows = dmd.rows
        total = self._pack_indices(np.diff(dmd.kv_indptr_cpu.numpy()))
        self.dec_kv_indices[:total].copy_(self.kv_indices_cpu[:total], non_blocking=True)
        self.dec_seq_lens[:rows].copy_(dmd.seq_lens)
        self.out_slots[:rows].copy_(dmd.out_slots)
        self.n_out, self.dec_max_len = rows, dmd.max_seq_len
        if self.cfg.kv_dtype == "fp8":
            return
        self.decode_graph.plan(  # expect: FC102
            dmd.kv_indptr, self.kv_indices_cpu[:total], dmd.last_page_len_cpu, *self.heads, self.cfg.page_size,
            q_data_type=torch.bfloat16,
        )

    def plan_prefill_graph(self, L: int, rows: int) -> None:
        """Plan a padded-length graph at capture: every row exactly ``L`` tokens."""
        pages, last = last_page_lens(torch.full((rows,), L, dtype=torch.int32), self.cfg.page_size)
        total = self._pack_indices(pages.numpy())
        self.last_page_len_cpu[:rows].copy_(last)
        self.padded_len, self.n_out = L, rows * L
        self.prefill_graph[L].plan(
            torch.arange(0, (rows + 1) * L, L, dtype=torch.int32), self.kv_indptr_cpu[: rows + 1],
            self.kv_indices_cpu[:total], self.last_page_len_cpu[:rows], *self.heads, self.cfg.page_size,
            causal=True, q_data_type=torch.bfloat16,
        )

    def plan_decode_graph(self, rows: int) -> None:
        pages = np.ones(rows, dtype=np.int32)
        total = self._pack_indices(pages)
        self.n_out = rows
        self.decode_graph.plan(
            self.kv_indptr_cpu[: rows + 1], self.kv_indices_cpu[:total], torch.ones(rows, dtype=torch.int32),
            *self.heads, self.cfg.page_size, q_data_type=torch.bfloat16,
        )

    def plan_refill(self, rows: int, seq_lens_cpu: torch.Tensor) -> None:
        pages, last = last_page_lens(seq_lens_cpu, self.cfg.page_size)
        total = self._pack_indices(pages.numpy())
        self.pod.plan(self.kv_indptr_cpu[: rows + 1], self.kv_indices_cpu[:total], last, *self.heads, self.cfg.page_size)

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor) -> None:
        flat = kv_cache.view(-1, 2, *kv_cache.shape[-2:])
        slots = self.out_slots[: self.n_out]
        flat[slots, 0] = k
        flat[slots, 1] = v

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        w = self.overflow_prefill if self.padded_len is None else self.prefill_graph[self.padded_len]
        return w.run(q, kv_cache)  # ok: FC108

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.cfg.kv_dtype == "fp8":
            n = q.shape[0]
            return xqa_batch_decode_with_kv_cache(
                q, kv_cache, self.xqa_ws, self.block_tables[:n], self.dec_seq_lens[:n], self.dec_max_len, 1.0, 1.0
            )
        return self.decode_graph.run(q, kv_cache)

    def forward_mixed(self, q_p: torch.Tensor, k_p: torch.Tensor, v_p: torch.Tensor, q_d: torch.Tensor,
                      kv_cache: torch.Tensor) -> torch.Tensor:
        return self.pod.run(q_p, k_p, v_p, q_d, kv_cache)  # expect: FC108
