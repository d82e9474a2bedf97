"""FlashInfer decode over the GPU window: graph-mode wrappers per bucket, an eager overflow wrapper,
an eager wrapper for pages in flight to the host, trtllm-gen context attention for prefill."""

from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, merge_state
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from hybridattn import HybridBatch, HybridConfig, window_last_page_len

from .workspace import context_workspace, graph_workspace, inflight_workspace, overflow_workspace


class WindowBackend:
    def __init__(self, cfg: HybridConfig, device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"  # ok: FC103
        self.graph_ws = graph_workspace(cfg, device)
        self.ctx_ws = context_workspace(cfg, device)
        self.overflow_decode = BatchDecodeWithPagedKVCacheWrapper(overflow_workspace(cfg, device), self._kv_layout,
                                                                  use_tensor_cores=True, backend="fa2")
        # pages evicted this step whose copy to the host has not landed yet
        self.inflight_decode = BatchDecodeWithPagedKVCacheWrapper(inflight_workspace(device), self._kv_layout,
                                                                  use_tensor_cores=True)
        max_bs = max(cfg.buckets)
        self.max_bucket = max_bs
        max_pages = cfg.max_batch * cfg.window_pages
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.seq_lens_static = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.indptr_pinned = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.kv_cache = torch.zeros((cfg.num_layers, cfg.gpu_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim),
                                    dtype=cfg.dtype, device=device)
        self.window_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)

    def init_window_buffers(self) -> None:
        self.last_page_len_buf.fill_(self.cfg.page_size)  # ok: FC104
        for bs in self.cfg.buckets:
            self.window_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, self._kv_layout, use_cuda_graph=True, use_tensor_cores=True, backend="fa2",
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )

    def plan_for_capture(self, bs: int) -> None:
        wp = self.cfg.window_pages
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32) * wp
        last_cpu = torch.full((bs,), self.cfg.page_size, dtype=torch.int32)
        self.window_wrappers[bs].plan(indptr_cpu, self.kv_indices_buf[: bs * wp], last_cpu, *self._heads,  # ok: FC102
                                      q_data_type=self.cfg.dtype)
        empty_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        self.inflight_decode.plan(empty_cpu, self.kv_indices_buf[:0], torch.ones(bs, dtype=torch.int32), *self._heads,
                                  q_data_type=self.cfg.dtype)

    def prepare_window(self, bs: int, batch: HybridBatch) -> None:
        """Before each replay: window pages of every row into the bound buffers, then plan."""
        bs_real = batch.batch_size
        if int(batch.seq_lens_cpu.max()) > self.cfg.max_context:  # ok: FC101
            raise ValueError(f"a row exceeds max_context={self.cfg.max_context}")
        n = int(batch.near_indptr_cpu[-1])
        self.indptr_pinned[: bs_real + 1].copy_(batch.near_indptr_cpu)
        self.indptr_pinned[bs_real + 1 : bs + 1] = n
        self.seq_lens_static[:bs_real].copy_(batch.seq_lens, non_blocking=True)
        self.seq_lens_static[bs_real:bs].fill_(1)
        self.kv_indices_buf[:n].copy_(batch.near_indices, non_blocking=True)  # ok: FC104
        self.window_wrappers[bs].plan(self.indptr_pinned[: bs + 1], self.kv_indices_buf[:n], window_last_page_len(self.seq_lens_static[:bs], self.cfg.page_size),  # expect: FC102
                                      *self._heads, q_data_type=self.cfg.dtype)
        self.inflight_decode.plan(batch.inflight_indptr_cpu, batch.inflight_indices, batch.inflight_last_cpu,
                                  *self._heads, q_data_type=self.cfg.dtype)
        # rows without any window page must still read one slot
        torch.clamp(self.last_page_len_buf[:bs], min=1, out=self.last_page_len_buf[:bs])  # expect: FC104

    def prepare_overflow(self, batch: HybridBatch) -> None:
        self.overflow_decode.plan(batch.near_indptr_cpu, batch.near_indices, batch.near_last_cpu, *self._heads,  # ok: FC102
                                  q_data_type=self.cfg.dtype)
        self.inflight_decode.plan(batch.inflight_indptr_cpu, batch.inflight_indices, batch.inflight_last_cpu,
                                  *self._heads, q_data_type=self.cfg.dtype)

    def attend_near(self, layer: int, q: torch.Tensor, bs: int):
        w = self.window_wrappers.get(bs, self.overflow_decode)
        o, lse = w.run(q, self.kv_cache[layer], return_lse=True)  # ok: FC108
        o_fl, lse_fl = self.inflight_decode.run(q, self.kv_cache[layer], return_lse=True)  # expect: FC108
        return merge_state(o, lse, o_fl, lse_fl)

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        flat = self.kv_cache[layer].view(-1, 2, self.cfg.num_kv_heads, self.cfg.head_dim)
        flat[:, 0].index_copy_(0, out_loc, k)
        flat[:, 1].index_copy_(0, out_loc, v)

    def run_context(self, q, layer: int, block_tables, seq_lens, max_q_len: int, max_kv_len: int,
                    cu_q, cu_kv, batch_size: int):
        return trtllm_batch_context_with_kv_cache(q, self.kv_cache[layer], self.ctx_ws, block_tables, seq_lens,
                                                  max_q_len, max_kv_len, self.cfg.head_dim ** -0.5, 1.0,
                                                  batch_size, cu_q, cu_kv)
