"""Decode attention whose rows may die mid-step.

Dead rows keep their place in the batch (graphs are replayed at the bucket size) but get
no KV pages: their attention output is replaced by attention over the padding page.
"""
from __future__ import annotations

import functools
from typing import Dict, List

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from abortable import PAD_PAGE, DecodeBatch, EngineConfig, clamp_dead_lengths, mask_rows_
from ab_attn.compat import PLAN_INFO_ATTR
from ab_attn.workspace import decode_graph_workspace, eager_decode_workspace, trtllm_prefill_workspace


class AbortAwareBackend:
    def __init__(self, cfg: EngineConfig, kv_cache: torch.Tensor, device: torch.device):
        self.cfg, self.device, self.kv_cache = cfg, device, kv_cache
        max_bs = cfg.max_running_requests
        max_pages = max_bs * cfg.max_pages_per_request
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.kv_last_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_np = self.kv_indptr_cpu.numpy()
        self.kv_indices_np = self.kv_indices_cpu.numpy()
        self.kv_last_np = self.kv_last_cpu.numpy()
        self.live_mask = torch.ones(max_bs, dtype=torch.bool, device=device)
        self.dead_rows_dev = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self._sm_scale = cfg.head_dim ** -0.5  # ok: FC103

        self.graph_ws = decode_graph_workspace(device)
        self.eager_ws = eager_decode_workspace(cfg, device)
        self.prefill_ws = trtllm_prefill_workspace(cfg, device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "HND", use_tensor_cores=True)
        # Dead rows attend to the padding page only, so a row whose pages were handed to
        # another request mid-step never reads that request's KV.
        self.pad_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "HND")
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "HND", backend="trtllm-gen")
        self._plan_eager = functools.partial(
            self.eager_decode.plan, num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim, page_size=cfg.page_size, sm_scale=self._sm_scale)

    def init_cuda_graph_state(self, buckets: List[int]) -> None:
        for bs in buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "HND", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])

    def debug_state(self) -> Dict[str, object]:
        return {
            "eager_plan": getattr(self.eager_decode, PLAN_INFO_ATTR, None),  # expect: FC103
            "buckets": sorted(self.graph_wrappers),
        }

    def _fill_host(self, rows: int, page_lists: List[List[int]], seq_lens_np: np.ndarray,
                   dead_rows: np.ndarray) -> int:
        """Host page lists for ``rows`` rows; dead rows and rows past the batch get no pages."""
        n_real = len(page_lists)
        counts = np.zeros(rows, dtype=np.int32)
        counts[:n_real] = [len(p) for p in page_lists]
        counts[dead_rows] = 0
        self.kv_indptr_np[0] = 0
        np.cumsum(counts, out=self.kv_indptr_np[1 : rows + 1])
        for row in range(n_real):
            if counts[row]:
                start = self.kv_indptr_np[row]
                self.kv_indices_np[start : start + counts[row]] = page_lists[row]
        self.kv_last_np[:rows] = 1
        self.kv_last_np[:n_real] = (seq_lens_np[:n_real] - 1) % self.cfg.page_size + 1
        self.kv_last_np[dead_rows] = 1
        return int(self.kv_indptr_np[rows])

    def _plan_pad(self, rows: int) -> None:
        pad_indptr = torch.arange(rows + 1, dtype=torch.int32)
        pad_indices = torch.full((rows,), PAD_PAGE, dtype=torch.int32)
        self.pad_decode.plan(pad_indptr, pad_indices, torch.ones(rows, dtype=torch.int32),
                             self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size)

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.kv_indptr_np[: bs + 1] = np.arange(bs + 1)
        self.kv_indices_np[:bs] = PAD_PAGE
        self.kv_last_np[:bs] = 1
        self.graph_wrappers[bs].plan(
            self.kv_indptr_cpu[: bs + 1], self.kv_indices_cpu[:bs], self.kv_last_cpu[:bs],
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size,
            sm_scale=self._sm_scale)
        self._plan_pad(bs)

    def init_forward_metadata(self, batch: DecodeBatch, dead_rows: np.ndarray) -> None:
        bs = batch.batch_size
        total = self._fill_host(bs, batch.page_lists, batch.seq_lens_np, dead_rows)
        if not batch.is_decode:
            self.prefill.plan(  # ok: FC102
                batch.qo_indptr_cpu, self.kv_indptr_cpu[: bs + 1], self.kv_indices_cpu[:total],
                self.kv_last_cpu[:bs], self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim,
                self.cfg.page_size, causal=True, sm_scale=self._sm_scale)
            return
        self.kv_indices[:total].copy_(self.kv_indices_cpu[:total], non_blocking=True)
        last = clamp_dead_lengths(batch.last_page_len, self.live_mask, bs)
        self._plan_eager(self.kv_indptr_cpu[: bs + 1], self.kv_indices[:total], last)  # expect: FC102
        self._plan_pad(bs)

    def prepare_replay(self, bs: int, padded: int, page_lists: List[List[int]], seq_lens_np: np.ndarray,
                       dead_rows: np.ndarray) -> None:
        total = self._fill_host(padded, page_lists, seq_lens_np, dead_rows)
        self.kv_indices[:total].copy_(self.kv_indices_cpu[:total], non_blocking=True)  # ok: FC104
        self.graph_wrappers[padded].plan(  # ok: FC102
            self.kv_indptr_cpu[: padded + 1], self.kv_indices[:total], self.kv_last_cpu[:padded],
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size,
            sm_scale=self._sm_scale)
        n_dead = len(dead_rows)
        if n_dead:
            # an abort may land between the host fill and the copy: pin dead rows to one slot
            self.dead_rows_dev[:n_dead].copy_(torch.from_numpy(dead_rows), non_blocking=True)
            mask_rows_(self.kv_last_page_len, self.dead_rows_dev[:n_dead], 1)  # expect: FC104

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        cache = self.kv_cache[layer]  # [pages, 2, kv_heads, page_size, head_dim]
        page, off = out_loc // self.cfg.page_size, out_loc % self.cfg.page_size
        cache[page, 0, :, off] = k
        cache[page, 1, :, off] = v

    def forward_decode(self, q: torch.Tensor, layer: int, bs: int) -> torch.Tensor:
        kv = self.kv_cache[layer]
        w = self.graph_wrappers.get(bs) or self.eager_decode
        out = w.run(q, kv)  # ok: FC108
        pad = self.pad_decode.run(q, kv)  # expect: FC108
        live = self.live_mask[:bs]
        return torch.where(live[:, None, None], out, pad)  # ok: FC101

    def forward_extend(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        return self.prefill.run(q, self.kv_cache[layer])
