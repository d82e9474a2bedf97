from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state

from lckv import DeviceWindow, OffloadConfig, WindowView
from lc_attn.workspace import chunk_prefill_workspace, decode_graph_workspace, summary_workspace


class WindowAttnBackend:
    """Exact attention over each request's window pages (graph-mode trtllm-gen
    decode wrappers per bucket) merged with attention over chunk summaries."""

    def __init__(self, cfg: OffloadConfig, window: DeviceWindow):
        self.cfg = cfg
        self.window = window
        self.device = window.device
        self._kv_layout = "NHD"
        max_bs = max(cfg.decode_buckets)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(cfg.max_window_pages, dtype=torch.int32, device=self.device)
        self.last_page_buf = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.indptr_pad_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_pad_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.graph_ws = decode_graph_workspace(cfg)
        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, self._kv_layout, use_cuda_graph=True, backend="trtllm-gen",
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_buf[:bs])
            for bs in cfg.decode_buckets
        }
        self.summary_wrapper = BatchDecodeWithPagedKVCacheWrapper(summary_workspace(self.device), self._kv_layout)
        self.chunk_prefill = BatchPrefillWithPagedKVCacheWrapper(
            chunk_prefill_workspace(cfg), self._kv_layout, backend="trtllm-gen")

    @property
    def layout(self) -> str:
        return self._kv_layout  # ok: FC103

    def init_window_buffers(self) -> None:
        self.kv_indptr_buf.zero_()
        self.last_page_buf.fill_(1)  # ok: FC104

    def _plan_args(self):
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                    page_size=c.page_size, q_data_type=c.dtype)

    def plan_capture(self, bs: int, summary_chunks: int) -> None:
        indptr = torch.arange(bs + 1, dtype=torch.int32)
        last = torch.ones(bs, dtype=torch.int32)
        self.decode_wrappers[bs].plan(indptr, self.kv_indices_buf[:bs], last, **self._plan_args())
        s_indptr = torch.arange(0, (bs + 1) * summary_chunks, summary_chunks, dtype=torch.int32)
        s_indices = torch.zeros(bs * summary_chunks, dtype=torch.int32, device=self.device)
        self.summary_wrapper.plan(s_indptr, s_indices, torch.full((bs,), self.cfg.page_size, dtype=torch.int32),
                                  **self._plan_args())

    def prepare_window(self, bs: int, view: WindowView) -> None:
        n, m = view.num_reqs, view.num_pages
        self.kv_indices_buf[:m].copy_(view.slot_ids, non_blocking=True)  # ok: FC104
        indptr = self.indptr_pad_host[: bs + 1]
        indptr[: n + 1].copy_(view.indptr_host)
        indptr[n + 1 :] = view.indptr_host[n]
        last = self.last_pad_host[:bs]
        last[:n].copy_(view.last_page_host)
        last[n:] = 1
        self.decode_wrappers[bs].plan(indptr, self.kv_indices_buf[:m], last, **self._plan_args())  # ok: FC102
        self.summary_wrapper.plan(view.summary_indptr, view.summary_indices, view.summary_last_host,  # expect: FC102
                                  **self._plan_args())
        # a stale row must never claim more than a page
        self.last_page_buf[:n].clamp_(max=self.cfg.page_size)  # expect: FC104

    def plan_chunk(self, qo_indptr_cpu: torch.Tensor, kv_indptr_cpu: torch.Tensor, kv_indices: torch.Tensor,
                   last_cpu: torch.Tensor) -> None:
        self.chunk_prefill.plan(qo_indptr_cpu, kv_indptr_cpu, kv_indices, last_cpu,  # ok: FC102
                                self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim,
                                self.cfg.page_size, causal=True, q_data_type=self.cfg.dtype)

    def window_attention(self, q: torch.Tensor, layer: int, bs: int) -> torch.Tensor:
        o_win, s_win = self.decode_wrappers[bs].run(q, self.window.kv[layer], return_lse=True)  # ok: FC108
        o_sum, s_sum = self.summary_wrapper.run(q, self.window.summary_kv[layer], return_lse=True)  # expect: FC108
        out, _ = merge_state(o_win, s_win, o_sum, s_sum)
        return out

    def chunk_attention(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        return self.chunk_prefill.run(q, self.window.kv[layer])
