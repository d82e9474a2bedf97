"""Sliding-window plugin: FlashInfer decode over the pages inside the window, optional attention sinks."""
from __future__ import annotations

import os
from typing import Dict, Tuple

import flashinfer
import numpy as np
import torch

from peab.batch import StepBatch
from peab.config import EngineConfig
from peab.registry import register_backend
from peab_plugins.base import AttentionBackend, KVCache

BACKEND_CLASS = "SlidingWindowBackend"
WINDOW_WORKSPACE_BYTES = int(os.environ.get("PEAB_WINDOW_WORKSPACE_BYTES", 64 * 1024 * 1024))


@torch.jit.script
def last_page_len_of(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    assert page_size > 0  # ok: FC109
    pages = torch.div(seq_lens + page_size - 1, page_size, rounding_mode="floor")
    return (seq_lens - (pages - 1) * page_size).to(torch.int32)


def _check_window(cfg: EngineConfig) -> None:
    assert cfg.sliding_window % cfg.page_size == 0, "the window must be a whole number of pages"  # expect: FC109


def window_page_table(seq_lens_cpu, kv_indptr_cpu, window_pages: int, page_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Host indptr of the pages inside each request's window and their positions in kv_indices."""
    seq = seq_lens_cpu.numpy()  # ok: FC101
    pages = np.minimum((seq + page_size - 1) // page_size, window_pages).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    gather = np.concatenate([np.arange(e - p, e, dtype=np.int64) for e, p in zip(kv_indptr_cpu[1:].numpy(), pages)])
    return torch.from_numpy(indptr), torch.from_numpy(gather)


@register_backend("fi_window")
class SlidingWindowBackend(AttentionBackend):
    def __init__(self, cfg: EngineConfig, layer_type: str, device: torch.device):
        super().__init__(cfg, layer_type, device)
        _check_window(cfg)
        self.window_left = cfg.sliding_window - 1
        self.window_pages = cfg.sliding_window // cfg.page_size + 1  # the oldest page is usually partial
        self.use_sinks = cfg.attention_sinks
        self.workspace = torch.empty(WINDOW_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.graph_workspace = torch.empty(cfg.graph_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.sink_workspace = self.workspace.new_empty(cfg.workspace_bytes())  # ok: FC105
        self.eager_decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, self.kv_layout, backend="fa2")
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, self.kv_layout, backend="fa2")
        # attention sinks: the first page of every request, merged with the window by log-sum-exp
        self.sink_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.sink_workspace, self.kv_layout)
        max_bs = cfg.max_batch_size
        self.win_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.win_indices = torch.zeros(max_bs * self.window_pages, dtype=torch.int32, device=device)
        self.win_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=device)
        self.win_last_page_len.fill_(cfg.page_size)  # ok: FC104
        self.win_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.win_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.sink_indptr_cpu = torch.arange(max_bs + 1, dtype=torch.int32)
        self.sink_last_cpu = torch.full((max_bs,), cfg.page_size, dtype=torch.int32)
        self.graph_wrappers: Dict[int, flashinfer.BatchDecodeWithPagedKVCacheWrapper] = {}

    def init_graph_state(self, max_bs: int) -> None:
        assert self.win_indices.numel() >= self.cfg.max_batch_size * self.window_pages  # ok: FC109
        for bs in self.cfg.graph_batch_sizes:
            if bs <= max_bs:
                self.graph_wrappers[bs] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    self.graph_workspace, self.kv_layout, use_cuda_graph=True, backend="fa2",
                    paged_kv_indptr_buffer=self.win_indptr[: bs + 1], paged_kv_indices_buffer=self.win_indices,
                    paged_kv_last_page_len_buffer=self.win_last_page_len[:bs])

    def _plan_sinks(self, bs: int, sink_pages: torch.Tensor) -> None:
        self.sink_wrapper.plan(  # ok: FC102
            self.sink_indptr_cpu[: bs + 1], sink_pages, self.sink_last_cpu[:bs], *self.dims, sm_scale=self._sm_scale
        )

    def init_forward_metadata(self, batch: StepBatch) -> None:
        self.graph_bs = None
        bs, ps = batch.batch_size, self.cfg.page_size
        if not batch.is_decode:
            # prefill keeps every page: the earliest query tokens see further back than the last one
            self.prefill_wrapper.plan(  # ok: FC102
                batch.qo_indptr_cpu, batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, *self.dims,
                causal=True, window_left=self.window_left, sm_scale=self._sm_scale)
            return
        if not (batch.seq_lens > self.cfg.sliding_window).any():  # expect: FC101
            indptr_cpu, indices = batch.kv_indptr_cpu, batch.kv_indices
        else:
            indptr_cpu, gather_cpu = window_page_table(batch.seq_lens_cpu, batch.kv_indptr_cpu, self.window_pages, ps)
            batch.window_gather = torch.empty(gather_cpu.numel(), dtype=torch.int64, device=self.device)  # ok: FC107
            batch.window_gather.copy_(gather_cpu, non_blocking=True)
            indices = batch.kv_indices[batch.window_gather]  # ok: FC101
        self.eager_decode.plan(  # expect: FC102
            indptr_cpu, indices, last_page_len_of(batch.seq_lens, ps), *self.dims,
            window_left=self.window_left, sm_scale=self._sm_scale)
        if self.use_sinks:
            self._plan_sinks(bs, batch.kv_indices[batch.kv_indptr[:-1].long()])
        # the KV eviction kernel frees pages behind the window by the device indptr
        pages = torch.clamp(torch.div(batch.seq_lens + ps - 1, ps, rounding_mode="floor"), max=self.window_pages)
        torch.cumsum(pages, 0, out=self.win_indptr[1 : bs + 1])  # expect: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.graph_bs = bs
        self.win_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.win_indptr_host[: bs + 1], self.win_indices[:bs], self.win_last_page_len_host[:bs], *self.dims,
            window_left=self.window_left, sm_scale=self._sm_scale)
        if self.use_sinks:
            self._plan_sinks(bs, self.win_indices[:bs])

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> None:
        self.graph_bs = bs
        real, ps = batch.batch_size, self.cfg.page_size
        indptr_cpu, gather_cpu = window_page_table(batch.seq_lens.cpu(), batch.kv_indptr_cpu, self.window_pages, ps)  # expect: FC101
        n = int(indptr_cpu[-1])
        if n > self.win_indices.numel():
            self.win_indices = torch.empty(2 * n, dtype=torch.int32, device=self.device)  # expect: FC107
        self.win_indices[:n] = batch.kv_indices[gather_cpu.to(self.device, non_blocking=True)]  # ok: FC104
        self.win_indptr_host[: real + 1] = indptr_cpu
        self.win_indptr_host[real + 1 : bs + 1] = n
        self.win_last_page_len_host[:real] = batch.kv_last_page_len_cpu
        self.win_last_page_len_host[real:bs] = 1
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.win_indptr_host[: bs + 1], self.win_indices, self.win_last_page_len_host[:bs], *self.dims,
            window_left=self.window_left, sm_scale=self._sm_scale)
        if self.use_sinks:
            self._plan_sinks(real, batch.kv_indices[batch.kv_indptr[:-1].long()])

    def forward_decode(self, q: torch.Tensor, kv_cache: KVCache, layer_id: int) -> torch.Tensor:
        bs = q.shape[0]
        if self.graph_bs is not None:
            w = self.graph_wrappers[self.graph_bs]
        else:
            w = self.eager_decode
        if not self.use_sinks:
            return w.run(q, kv_cache)
        # the sink pass reads the first page: point the window's entry at the reserved page 0
        self.win_indices[self.win_indptr[:bs].long()] = 0  # expect: FC104
        o_win, lse_win = w.run_return_lse(q, kv_cache)  # ok: FC108
        o_sink, lse_sink = self.sink_wrapper.run_return_lse(q, kv_cache)  # expect: FC108
        out, _ = flashinfer.merge_state(o_win, lse_win, o_sink, lse_sink)
        return out

    def forward_extend(self, q, k, v, kv_cache: KVCache, layer_id: int) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    def reset_window_state(self) -> None:
        """Aborted requests: forget the page ids the graphs last saw."""
        self.win_indices.zero_()  # expect: FC104

    def disable_graphs(self) -> None:
        for w in self.graph_wrappers.values():
            setattr(w, "_use_cuda_graph", False)  # expect: FC103

    def graph_capacity(self) -> Dict[int, int]:
        return {bs: w._paged_kv_indices_buf.numel() for bs, w in self.graph_wrappers.items()}  # expect: FC103
