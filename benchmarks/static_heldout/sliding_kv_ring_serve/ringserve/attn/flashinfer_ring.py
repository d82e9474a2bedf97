"""FlashInfer attention over ring-buffer pages: graph-mode decode wrappers per batch size (page tables
recomputed every step, since a wrapped ring rotates its page order), an eager tensor-core decode wrapper, a
wrapper for the global layers, a ragged prompt prefill, and trtllm-gen for eager batches past the buckets."""

from __future__ import annotations

import functools
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from ringserve.attn.base import ForwardBatch, RingAttnBackend
from ringserve.config import WINDOW_WORKSPACE_BYTES, RingConfig
from ringserve.ring.ring_cache import RingKVCache
from ringserve.ring.wrap import wrapped_slot_ids
from ringserve.utils import exclusive_cumsum, host_page_table

_PLAN_INFO_ATTR = "_plan_info"


class FlashInferRingBackend(RingAttnBackend):
    name = "flashinfer"

    def __init__(self, cfg: RingConfig, cache: RingKVCache, device: torch.device):
        super().__init__(cfg, cache, device)
        max_bs = cfg.max_graph_bs
        wp = cfg.window_pages
        self.float_workspace = torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.global_workspace = torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_workspace = torch.empty(WINDOW_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105

        # persistent metadata read by the captured decode graphs (largest captured batch)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * wp, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        # pinned host mirrors that plan() reads
        self.kv_indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_pinned_np = self.kv_indptr_pinned.numpy()
        self.last_page_len_pinned_np = self.last_page_len_pinned.numpy()

        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.float_workspace, "NHD", use_tensor_cores=True)
        self.global_decode = BatchDecodeWithPagedKVCacheWrapper(self.global_workspace, "NHD", backend="fa2")
        self.ragged_prefill = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.active_graph_bs: Optional[int] = None
        self.captured_max_seq: Dict[int, int] = {}
        self.rope_offsets: Optional[torch.Tensor] = None
        self.wrap_scratch: Optional[torch.Tensor] = None
        # (total pages, batch size) of the last plan per captured size, for the stats endpoint
        self._plan_info: Dict[int, Tuple[int, int]] = {}  # ok: FC103
        self._plan_ragged = functools.partial(
            self.ragged_prefill.plan, num_qo_heads=cfg.num_q_heads, num_kv_heads=cfg.num_kv_heads,
            head_dim_qk=cfg.head_dim, causal=True, window_left=cfg.window - 1,
        )

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self.active_graph_bs = None
        if batch.is_decode:
            self._init_decode(batch)
        else:
            self._init_extend(batch)

    def _decode_plan_kwargs(self) -> dict:
        cfg = self.cfg
        return dict(
            num_qo_heads=cfg.num_q_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            page_size=cfg.page_size, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
        )

    def _init_decode(self, batch: ForwardBatch) -> None:
        cfg = self.cfg
        bs = batch.batch_size
        if self.rope_offsets is None or self.rope_offsets.numel() < bs:
            self.rope_offsets = torch.zeros(max(bs, 64), dtype=torch.int64, device=self.device)  # expect: FC107
        if self.wrap_scratch is None:
            self.wrap_scratch = torch.empty(cfg.max_requests, cfg.window_pages, dtype=torch.int32, device=self.device)  # ok: FC107
        if batch.all_rings_full:
            # steady state: every row holds exactly window_pages pages, rotated by its head
            rows = self.cache.ring_pages_gpu.index_select(0, batch.slots_gpu.long())
            ids = wrapped_slot_ids(rows, batch.heads_gpu, batch.valid_pages_gpu, cfg.window_pages)
            kv_indices = ids.reshape(-1)
            pages_used = self.cache.pages_used_gpu.index_select(0, batch.slots_gpu.long())
            kv_indptr = exclusive_cumsum(pages_used)
            self.eager_decode.plan(  # expect: FC102
                kv_indptr, kv_indices, batch.last_page_len_cpu, window_left=cfg.window - 1, **self._decode_plan_kwargs()
            )
        else:
            indptr_np, indices_np, last_np = self.cache.build_host_table(batch.slots_np)
            pages_cpu = torch.tensor(np.diff(indptr_np), dtype=torch.int32)
            indptr_cpu = exclusive_cumsum(pages_cpu)
            total_pages = int(indptr_cpu[-1])  # ok: FC101
            kv_indices = torch.tensor(indices_np[:total_pages], dtype=torch.int32).to(self.device, non_blocking=True)
            last_cpu = torch.tensor(last_np, dtype=torch.int32)
            self.eager_decode.plan(  # ok: FC102
                indptr_cpu, kv_indices, last_cpu, window_left=cfg.window - 1, **self._decode_plan_kwargs()
            )
        # global layers attend over the append-only run of each request
        g_indptr_cpu, g_last_cpu = host_page_table(batch.global_pages_np, batch.seq_lens_np, cfg.page_size)
        self.global_decode.plan(g_indptr_cpu, batch.global_indices_gpu, g_last_cpu, **self._decode_plan_kwargs())  # ok: FC102

    def _init_extend(self, batch: ForwardBatch) -> None:
        qo_indptr = torch.tensor(batch.extend_indptr_np, dtype=torch.int32).to(self.device, non_blocking=True)
        self._plan_ragged(qo_indptr, qo_indptr, q_data_type=torch.bfloat16)  # expect: FC102

    def init_forward_metadata_capture_cuda_graph(self, bs: int, slots_np: np.ndarray) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.float_workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.graph_decode[bs] = w
        self.kv_last_page_len[:bs].fill_(1)  # ok: FC104
        self.active_graph_bs = bs
        self._plan_graph(w, bs, slots_np)

    def _plan_graph(self, w: BatchDecodeWithPagedKVCacheWrapper, bs: int, slots_np: np.ndarray) -> int:
        cfg = self.cfg
        indptr_np, indices_np, last_np = self.cache.build_host_table(slots_np)
        rows = len(slots_np)
        n = int(indptr_np[-1])
        self.kv_indptr_pinned_np[: rows + 1] = indptr_np
        self.kv_indptr_pinned_np[rows + 1 : bs + 1] = n
        self.last_page_len_pinned_np[:rows] = last_np
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_pinned[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:n].copy_(torch.tensor(indices_np, dtype=torch.int32, pin_memory=True), non_blocking=True)
        w.plan(
            self.kv_indptr_pinned[: bs + 1], self.kv_indices[:n], self.last_page_len_pinned[:bs],
            window_left=cfg.window - 1, **self._decode_plan_kwargs(),
        )
        self._plan_info[bs] = (n, rows)
        return n

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, slots_np: np.ndarray, crossed_page: bool) -> None:
        w = self.graph_decode[bs]
        self.active_graph_bs = bs
        if not crossed_page and getattr(w, _PLAN_INFO_ATTR, None) is not None:  # expect: FC103
            # no request started a new page: the split plan of the last step still fits
            return
        n = self._plan_graph(w, bs, slots_np[:raw_bs])
        # padded rows read one token of the dummy page
        self.kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
        self.kv_indptr_pinned[bs + 1 :].fill_(n)  # ok: FC104

    def on_ring_wrap(self, flat_pos: torch.Tensor, new_pages: torch.Tensor) -> None:
        """A full ring overwrote its oldest page: patch the page id in place instead of re-planning."""
        if self.active_graph_bs is None:
            return
        self.kv_indices[flat_pos] = new_pages  # expect: FC104

    def forward_decode(self, q, k_cache, v_cache, layer_id, is_global):
        if is_global:
            return self.global_decode.run(q, (k_cache, v_cache))  # expect: FC108
        w = self.eager_decode if self.active_graph_bs is None else self.graph_decode[self.active_graph_bs]
        return w.run(q, (k_cache, v_cache))  # ok: FC108

    def forward_decode_large(self, q: torch.Tensor, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        k_cache, v_cache = self.cache.layer(layer_id)
        return trtllm_batch_decode_with_kv_cache(
            q, (k_cache, v_cache), self.trtllm_workspace, batch.block_tables_gpu, batch.seq_lens_gpu,
            batch.max_seq_len, bmm1_scale=self.sm_scale, bmm2_scale=1.0, window_left=self.cfg.window - 1,
        )

    def forward_extend(self, q, k, v, layer_id):
        return self.ragged_prefill.run(q, k, v)
