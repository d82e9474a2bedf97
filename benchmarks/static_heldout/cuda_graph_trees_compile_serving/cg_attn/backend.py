import functools
from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from cgt import ServingConfig, last_page_lens
from cg_attn.metadata import DecodeMetadata
from cg_attn.workspace import eager_decode_workspace, graph_workspace, prefill_workspace, trtllm_overflow_workspace


class GraphTreeAttnBackend:
    """Sliding-window graph-mode decode wrappers per bucket (hand graphs and compiled trees), a
    full-context wrapper for the global layers, a prefill wrapper and a trtllm-gen overflow path."""

    def __init__(self, cfg: ServingConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.page_size = cfg.page_size
        self.window_left = cfg.sliding_window - 1
        self.global_every = cfg.global_layer_every
        self.sm_scale = cfg.head_dim ** -0.5
        self._plan_info: Dict[int, tuple] = {}
        max_bs = max(cfg.hand_buckets)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_buf = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.graph_ws = graph_workspace(cfg)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in cfg.hand_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.kv_last_page_buf[:bs])
        # compiled buckets get buffers of their own: the trees and the hand
        # graphs may both be in flight across a bucket switch
        self.compiled_bufs: Dict[int, Dict[str, torch.Tensor]] = {}
        for bs in cfg.compiled_buckets:
            indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
            indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
            last = torch.ones(bs, dtype=torch.int32, device=self.device)
            self.compiled_bufs[bs] = {"indptr": indptr, "indices": indices, "last": last}
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
                paged_kv_last_page_len_buffer=last)
        self.global_wrapper = BatchDecodeWithPagedKVCacheWrapper(eager_decode_workspace(self.device), "NHD")
        self._plan_global = functools.partial(
            self.global_wrapper.plan, num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim, page_size=cfg.page_size, q_data_type=cfg.dtype)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(cfg), "NHD", backend="fa2")
        self.overflow_ws = trtllm_overflow_workspace(cfg.trtllm_workspace_bytes(), cfg.device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

    def init_cuda_graph_state(self) -> None:
        self.kv_indptr_buf.zero_()
        self.kv_indices_buf.zero_()
        self.kv_last_page_buf.fill_(1)  # ok: FC104

    def _plan_bucket(self, bs: int, indptr_cpu: torch.Tensor, indices: torch.Tensor, last_cpu: torch.Tensor) -> None:
        self.graph_wrappers[bs].plan(indptr_cpu, indices, last_cpu, self.cfg.num_qo_heads, self.cfg.num_kv_heads,
                                     self.cfg.head_dim, self.page_size, window_left=self.window_left,
                                     q_data_type=self.cfg.dtype)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, meta: DecodeMetadata) -> None:
        self._plan_bucket(bs, meta.kv_indptr_cpu, meta.kv_indices, meta.kv_last_page_len_cpu)
        self._plan_global(meta.kv_indptr_cpu, meta.kv_indices, meta.kv_last_page_len_cpu)

    def init_forward_metadata(self, meta: DecodeMetadata) -> None:
        """Compiled buckets: the trees replay inside torch.compile, the plans run here."""
        w = self.graph_wrappers[meta.bucket]
        w.plan(meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len_cpu, self.cfg.num_qo_heads,  # expect: FC102
               self.cfg.num_kv_heads, self.cfg.head_dim, self.page_size,
               window_left=self.window_left, q_data_type=self.cfg.dtype)
        self._plan_global(meta.kv_indptr_cpu, meta.kv_indices, last_page_lens(meta.seq_lens, self.page_size))  # expect: FC102
        self._plan_info[meta.bucket] = (meta.num_reqs, meta.num_indices)  # ok: FC103

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: DecodeMetadata) -> None:
        n, total = meta.num_reqs, meta.num_indices
        self.kv_indices_buf[:total].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        indptr_host = self.kv_indptr_host[: bs + 1]
        indptr_host.copy_(meta.kv_indptr_cpu)
        last_host = self.kv_last_page_host[:bs]
        last_host.copy_(meta.kv_last_page_len_cpu)
        self.graph_wrappers[bs].plan(indptr_host, self.kv_indices_buf[:total], last_host,  # ok: FC102
                                     self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim,
                                     self.page_size, window_left=self.window_left, q_data_type=self.cfg.dtype)
        self._plan_global(indptr_host, meta.kv_indices, last_host)
        # padded rows must not read any page
        self.kv_last_page_buf[n:bs].zero_()  # expect: FC104
        self._plan_info[bs] = (n, total)

    def plan_prefill(self, qo_indptr_cpu: torch.Tensor, kv_indptr_cpu: torch.Tensor,
                     kv_indices: torch.Tensor, last_page_cpu: torch.Tensor) -> None:
        self.prefill_wrapper.plan(qo_indptr_cpu, kv_indptr_cpu, kv_indices, last_page_cpu,  # ok: FC102
                                  self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim,
                                  self.page_size, causal=True, q_data_type=self.cfg.dtype)

    def decode_attention(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int, ctx) -> torch.Tensor:
        if ctx.bucket is None:
            return trtllm_batch_decode_with_kv_cache(q, kv_cache, self.overflow_ws, ctx.block_tables, ctx.seq_lens,
                                                     ctx.max_seq_len, bmm1_scale=self.sm_scale, bmm2_scale=1.0)
        if layer_id % self.global_every == self.global_every - 1:
            return self.global_wrapper.run(q, kv_cache)  # expect: FC108
        return self.graph_wrappers[ctx.bucket].run(q, kv_cache)  # ok: FC108

    def prefill_attention(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)
