"""FlashInfer attention for the ring-window engine.

Sliding layers decode over the rotated ring table with ``window_left``; the
full-context layers decode over the global pool.  Decode batches up to the
largest bucket replay a CUDA graph whose ring wrappers are bound to the
persistent ``graph_*`` buffers below.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from mistralring.attn.workspace import fa2_workspace, global_decode_workspace, graph_workspace, trtllm_workspace
from mistralring.config import MistralRingConfig
from mistralring.ring_cache import RingBatch, RingKVCache


@dataclasses.dataclass
class PrefillChunk:
    """One prompt chunk per new request; the scheduler builds every indptr on the host."""

    qo_indptr_cpu: torch.Tensor
    ring_indptr_cpu: torch.Tensor
    ring_indices: torch.Tensor
    ring_last_page_len_cpu: torch.Tensor
    global_indptr_cpu: torch.Tensor
    global_indices: torch.Tensor
    global_last_page_len_cpu: torch.Tensor


class RingWindowBackend:
    def __init__(self, cfg: MistralRingConfig, cache: RingKVCache, device: torch.device):
        self.cfg = cfg
        self.cache = cache
        self.device = device
        self.float_ws = fa2_workspace(cfg, device)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.float_ws, "NHD", backend="fa2")
        self.global_prefill = BatchPrefillWithPagedKVCacheWrapper(self.float_ws, "NHD", backend="fa2")
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.float_ws, "NHD", use_tensor_cores=True, backend="fa2"
        )
        self.global_decode = BatchDecodeWithPagedKVCacheWrapper(
            global_decode_workspace(device), "NHD", use_tensor_cores=True, backend="fa2"
        )
        # Blackwell: the sliding layers go through trtllm-gen over the rotated block table
        self.trtllm_ws = trtllm_workspace(cfg, device) if cfg.use_trtllm_gen else None

        gbs = cfg.max_graph_bs
        self.graph_ws = graph_workspace(cfg, device)
        self.graph_kv_indptr = torch.zeros(gbs + 1, dtype=torch.int32, device=device)
        self.graph_kv_indices = torch.zeros(gbs * cfg.ring_pages, dtype=torch.int32, device=device)
        self.graph_last_page_len = torch.ones(gbs, dtype=torch.int32, device=device)
        # pinned mirrors the graph plans read
        self.kv_indptr_host = torch.zeros(gbs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(gbs, dtype=torch.int32, pin_memory=True)
        self.ring_graph: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.global_out: Optional[torch.Tensor] = None
        self.stats = {"steps": 0, "window_pages": 0}

    def init_graph_wrappers(self) -> None:
        for bs in self.cfg.graph_buckets:
            self.ring_graph[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.graph_kv_indices,
                paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
                backend="fa2",
            )
        self.graph_last_page_len.fill_(1)  # ok: FC104

    @property
    def bound_last_page_len(self) -> torch.Tensor:
        return self.graph_last_page_len

    # ------------------------------------------------------------ metadata
    def plan_prefill(self, chunk: PrefillChunk) -> None:
        cfg = self.cfg
        common = dict(num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim_qk=cfg.head_dim,
                      page_size=cfg.page_size, causal=True, q_data_type=cfg.dtype)
        self.prefill_wrapper.plan(
            chunk.qo_indptr_cpu, chunk.ring_indptr_cpu, chunk.ring_indices, chunk.ring_last_page_len_cpu,
            window_left=self.cache.window_left, **common,
        )
        self.global_prefill.plan(
            chunk.qo_indptr_cpu, chunk.global_indptr_cpu, chunk.global_indices, chunk.global_last_page_len_cpu,
            **common,
        )

    def init_forward_metadata(self, batch: RingBatch) -> None:
        """Eager decode metadata, for batches above the largest graph bucket."""
        cfg = self.cfg
        self.cache.rotate_heads(batch)
        pt = self.cache.build_page_table(batch)
        self.stats["steps"] += 1
        self.stats["window_pages"] += batch.window_pages
        self.decode_wrapper.plan(  # expect: FC102
            pt.indptr, pt.indices, pt.last_page_len_cpu,
            cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
            window_left=self.cache.window_left, q_data_type=cfg.dtype,
        )
        g_indptr, g_indices, g_last = self.cache.global_page_table(batch)
        self.global_decode.plan(  # ok: FC102
            g_indptr, g_indices, g_last,
            cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, q_data_type=cfg.dtype,
        )
        if self.global_out is None:
            self.global_out = torch.empty(  # ok: FC107
                cfg.max_batch_size, cfg.num_qo_heads, cfg.head_dim, dtype=cfg.dtype, device=self.device
            )

    def refresh_bound_table(self, batch: RingBatch, wrapped: torch.Tensor) -> None:
        """Steady state: every ring is full, so the bound indices are ``n x ring_pages``
        and the plan's indptr cannot change.  Copy the rotated rows of the rings that
        wrapped and the new last-page lengths, so that a step of the same batch can
        replay without another ``load_bucket``."""
        n, R, P = batch.batch_size, self.cfg.ring_pages, self.cfg.page_size
        table = self.cache.batch_table[:n]
        full = self.graph_kv_indices[: n * R].view(n, R)
        rotated = torch.where(wrapped.unsqueeze(1), table, full)
        full.copy_(rotated)  # expect: FC104
        self.bound_last_page_len[:n] = (batch.seq_lens - 1) % P + 1  # expect: FC104

    # ------------------------------------------------------------- forward
    def forward_prefill(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        if self.cfg.is_global_layer(layer_id):
            return self.global_prefill.run(q, self.cache.global_kv[layer_id])
        return self.prefill_wrapper.run(q, self.cache.ring_kv[layer_id])

    def forward_decode(self, q: torch.Tensor, layer_id: int, batch: RingBatch) -> torch.Tensor:
        bs = q.shape[0]
        if self.cfg.is_global_layer(layer_id):
            out = self.global_out[:bs] if batch.graph_bs is None and self.global_out is not None else None
            return self.global_decode.run(q, self.cache.global_kv[layer_id], out=out)  # expect: FC108
        kv = self.cache.ring_kv[layer_id]
        if self.trtllm_ws is not None:
            return trtllm_batch_decode_with_kv_cache(
                q, kv, self.trtllm_ws, self.cache.batch_table[:bs], batch.seq_lens, self.cfg.max_context_len,
                bmm1_scale=self.cfg.head_dim**-0.5, window_left=self.cache.window_left, kv_layout="NHD",
            )
        wrapper = self.ring_graph[batch.graph_bs] if batch.graph_bs is not None else self.decode_wrapper
        return wrapper.run(q, kv)  # ok: FC108
