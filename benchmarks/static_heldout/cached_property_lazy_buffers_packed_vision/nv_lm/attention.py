"""Paged attention of the language model: eager prefill and decode, decode graphs per bucket."""

from __future__ import annotations

import functools
from typing import Dict, Iterable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from navit import PAGE_SIZE
from navit.config import VLMConfig
from navit.lazy import DeviceBuffer, scratch_workspace
from navit.packing import LMBatch
from navit.tracing import traced_methods

_WS_MIB = {"graph": 160, "window": 96}


def _decode_wrapper(workspace: torch.Tensor, layout: str) -> BatchDecodeWithPagedKVCacheWrapper:
    return BatchDecodeWithPagedKVCacheWrapper(workspace, layout)


def _pages(lens: torch.Tensor) -> torch.Tensor:
    return (lens + PAGE_SIZE - 1) // PAGE_SIZE


@traced_methods("prepare_prefill", "prepare_decode", "advance_pages")
class LMAttention:
    kv_indptr_buf = DeviceBuffer(lambda s: (s.cfg.max_batch_size + 1,))
    last_page_len_buf = DeviceBuffer(lambda s: (s.cfg.max_batch_size,), fill=1)
    seq_lens_buf = DeviceBuffer(lambda s: (s.cfg.max_batch_size,))
    PREFILL_WS_BYTES = 384 * 1024 * 1024

    def __init__(self, cfg: VLMConfig, device: torch.device, kv_cache: torch.Tensor, page_table_np: np.ndarray):
        self.cfg, self.device, self.kv_cache, self.page_table_np = cfg, device, kv_cache, page_table_np
        self._kv_layout, self._backend = "NHD", "fa2"
        self._use_cuda_graph = bool(cfg.decode_buckets)  # ok: FC103
        self._plan_info: Dict[str, int] = {}
        self.use_tensor_cores = cfg.num_heads // cfg.num_kv_heads >= 4
        self.decode_wrapper = _decode_wrapper(self.decode_workspace, self._kv_layout)  # ok: FC103
        self._plan_decode = self.decode_wrapper.plan
        window_ws = torch.empty(cfg.max_batch_size * cfg.num_heads * cfg.head_dim * 4 * 64, dtype=torch.uint8, device=device)  # ok: FC105
        self.window_decode = _decode_wrapper(window_ws, "NHD")
        prefill_ws = torch.empty(self.PREFILL_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_ws, "NHD")
        self.long_prefill = BatchPrefillWithPagedKVCacheWrapper(scratch_workspace(cfg.prefill_workspace_bytes(), device), "NHD", backend="trtllm-gen")
        self.active_prefill = self.prefill_wrapper
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.kv_indptr_cpu = torch.zeros(cfg.max_batch_size + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(cfg.max_batch_size, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.empty(cfg.num_pages, dtype=torch.int32, device=device)
        self.window_indices: Optional[torch.Tensor] = None
        self.prefill_qo_indptr: Optional[torch.Tensor] = None

    @functools.cached_property
    def decode_workspace(self) -> torch.Tensor:
        return torch.empty(self.cfg.lm_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106

    @functools.cached_property
    def graph_workspace(self) -> torch.Tensor:
        return torch.empty(_WS_MIB["graph"] << 20, dtype=torch.uint8, device=self.device)  # expect: FC106

    @functools.cached_property
    def trtllm_workspace(self) -> torch.Tensor:
        return torch.empty(self.cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105

    @functools.cached_property
    def trtllm_decode(self) -> BatchDecodeWithPagedKVCacheWrapper:
        return BatchDecodeWithPagedKVCacheWrapper(self.trtllm_workspace, "NHD", backend="trtllm-gen")

    @functools.cached_property
    def tc_decode(self) -> BatchDecodeWithPagedKVCacheWrapper:
        return BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace.new_empty(self.cfg.lm_workspace_bytes), "NHD", use_tensor_cores=True)  # ok: FC105

    @functools.cached_property
    def graph_kv_indptr(self) -> torch.Tensor:
        return torch.zeros(self.cfg.max_batch_size + 1, dtype=torch.int32, device=self.device)  # ok: FC107

    @functools.cached_property
    def graph_kv_indptr_cpu(self) -> torch.Tensor:
        return torch.zeros(self.cfg.max_batch_size + 1, dtype=torch.int32, pin_memory=True)

    @functools.cached_property
    def graph_kv_indices(self) -> torch.Tensor:
        return torch.zeros(self.cfg.max_batch_size * self.cfg.max_pages_per_seq, dtype=torch.int32, device=self.device)

    @functools.cached_property
    def graph_last_page_len(self) -> torch.Tensor:
        return torch.ones(self.cfg.max_batch_size, dtype=torch.int32, device=self.device)

    def _heads(self):
        return self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim, PAGE_SIZE

    def _upload_indices(self, slots_cpu: torch.Tensor, start_cpu: torch.Tensor, pages_cpu: torch.Tensor, out: torch.Tensor) -> int:
        rows = zip(slots_cpu.tolist(), start_cpu.tolist(), pages_cpu.tolist())  # ok: FC101
        idx = np.concatenate([self.page_table_np[s, b : b + p] for s, b, p in rows])
        out[: idx.shape[0]].copy_(torch.from_numpy(idx), non_blocking=True)
        return idx.shape[0]

    def init_graph_wrappers(self, buckets: Iterable[int]) -> None:
        assert not self.graph_wrappers, "graph wrappers built twice"  # ok: FC109
        self.graph_last_page_len.fill_(1)  # ok: FC104
        for bs in buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.graph_kv_indices, paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs])

    def prepare_prefill(self, fb: LMBatch) -> None:
        bs = fb.batch_size
        self.prefill_qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)  # expect: FC107
        torch.cumsum(fb.extend_lens, 0, out=self.prefill_qo_indptr[1:])
        fb.qo_indptr = self.prefill_qo_indptr
        pages_cpu = _pages(fb.seq_lens_cpu)
        kv_indptr_cpu = F.pad(torch.cumsum(pages_cpu, 0, dtype=torch.int32), (1, 0))
        self.last_page_len_cpu[:bs] = (fb.seq_lens_cpu - 1) % PAGE_SIZE + 1
        self._upload_indices(fb.slots_cpu, torch.zeros_like(pages_cpu), pages_cpu, self.kv_indices)
        if bool((fb.extend_lens > self.cfg.long_prompt_threshold).any()):  # expect: FC101
            qo_indptr_cpu = F.pad(torch.cumsum(fb.extend_lens_cpu, 0, dtype=torch.int32), (1, 0))
            self.long_prefill.plan(  # ok: FC102
                qo_indptr_cpu, kv_indptr_cpu, self.kv_indices, self.last_page_len_cpu[:bs], *self._heads(), causal=True)
            info = self.long_prefill._plan_info  # expect: FC103
            self._plan_info["long_prefill"] = len(info)  # ok: FC103
            self.active_prefill = self.long_prefill
        else:
            self.prefill_wrapper.plan(  # expect: FC102
                self.prefill_qo_indptr, kv_indptr_cpu, self.kv_indices, self.last_page_len_cpu[:bs], *self._heads(), causal=True)
            self.active_prefill = self.prefill_wrapper

    def prepare_decode(self, fb: LMBatch) -> None:
        bs = fb.batch_size
        if self.kv_indptr_cpu.numel() < bs + 1:
            self.kv_indptr_cpu = torch.zeros(2 * bs + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
        pages_cpu = _pages(fb.seq_lens_cpu)
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(pages_cpu, 0)
        self.last_page_len_cpu[:bs] = (fb.seq_lens_cpu - 1) % PAGE_SIZE + 1
        n = int(self.kv_indptr_cpu[bs])
        if self.kv_indices.numel() < n:
            self.kv_indices = torch.cat([self.kv_indices, self.kv_indices.new_empty(n)])  # expect: FC107
        self._upload_indices(fb.slots_cpu, torch.zeros_like(pages_cpu), pages_cpu, self.kv_indices)
        self.seq_lens_buf.resize_(bs)  # expect: FC107
        self.seq_lens_buf.copy_(fb.seq_lens)
        torch.remainder(self.seq_lens_buf - 1, PAGE_SIZE, out=self.last_page_len_buf[:bs]).add_(1)
        if self.use_tensor_cores:
            self.tc_decode.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.last_page_len_buf[:bs], *self._heads())  # expect: FC102
        else:
            kv_indptr_gpu = self.kv_indptr_cpu[: bs + 1].to(self.device, non_blocking=True)
            self._plan_decode(kv_indptr_gpu, self.kv_indices, self.last_page_len_cpu[:bs], *self._heads())  # expect: FC102
        if self.cfg.use_trtllm_decode:
            self.trtllm_decode.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.last_page_len_cpu[:bs], *self._heads())  # ok: FC102
        if int(self.seq_lens_buf[:bs].max()) > self.cfg.sliding_window:  # expect: FC101
            self._prepare_window(fb, pages_cpu)
        self.kv_indptr_buf[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104

    def _prepare_window(self, fb: LMBatch, pages_cpu: torch.Tensor) -> None:
        win_pages_cpu = _pages(fb.seq_lens_cpu.clamp(max=self.cfg.sliding_window))
        n = int(win_pages_cpu.sum())
        if self.window_indices is None or self.window_indices.numel() < n:
            self.window_indices = torch.empty(2 * n, dtype=torch.int32, device=self.device)  # expect: FC107
        self._upload_indices(fb.slots_cpu, pages_cpu - win_pages_cpu, win_pages_cpu, self.window_indices)
        win_indptr_cpu = F.pad(torch.cumsum(win_pages_cpu, 0, dtype=torch.int32), (1, 0))
        self.window_decode.plan(  # expect: FC102
            win_indptr_cpu, self.window_indices, (fb.seq_lens - 1) % PAGE_SIZE + 1, *self._heads(), window_left=self.cfg.sliding_window - 1)

    def init_capture_metadata(self, bs: int) -> None:
        self.graph_kv_indptr[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            torch.arange(bs + 1, dtype=torch.int32), self.graph_kv_indices, torch.ones(bs, dtype=torch.int32), *self._heads())

    def prepare_replay(self, bs: int, seq_lens_cpu: torch.Tensor, slots_cpu: torch.Tensor) -> None:
        pages_cpu = _pages(seq_lens_cpu[:bs])
        self.graph_kv_indptr_cpu[1 : bs + 1] = torch.cumsum(pages_cpu, 0)  # ok: FC104
        self.graph_kv_indptr[: bs + 1].copy_(self.graph_kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self._upload_indices(slots_cpu[:bs], torch.zeros_like(pages_cpu), pages_cpu, self.graph_kv_indices)  # ok: FC104
        self.graph_wrappers[bs].plan(  # expect: FC102
            self.graph_kv_indptr[: bs + 1], self.graph_kv_indices, self.graph_last_page_len[:bs], *self._heads())
        self.graph_last_page_len[:bs].copy_((seq_lens_cpu[:bs] - 1) % PAGE_SIZE + 1, non_blocking=True)  # expect: FC104

    def advance_pages(self, bs: int, opened: torch.Tensor) -> None:
        self.graph_kv_indptr[1 : bs + 1] += torch.cumsum(opened, 0, dtype=torch.int32)  # expect: FC104

    def scrub_graph_pages(self) -> None:
        for w in self.graph_wrappers.values():
            stale = w._paged_kv_indices_buf  # expect: FC103
            stale.zero_()  # expect: FC104

    def snapshot_graph_pages(self, bs: int) -> torch.Tensor:
        snap = self.graph_kv_indices[: bs * self.cfg.max_pages_per_seq].clone()
        snap.masked_fill_(snap == 0, -1)  # ok: FC104
        return snap

    def kernels_ready(self) -> bool:
        return hasattr(self.tc_decode, "_cached_module")  # expect: FC103

    def save_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        cache = self.kv_cache[layer_id]
        cache[loc // PAGE_SIZE, 0, loc % PAGE_SIZE] = k
        cache[loc // PAGE_SIZE, 1, loc % PAGE_SIZE] = v

    def prefill(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.active_prefill.run(q, self.kv_cache[layer_id])  # ok: FC108

    def decode(self, q: torch.Tensor, layer_id: int, fb: LMBatch) -> torch.Tensor:
        kv = self.kv_cache[layer_id]
        if layer_id >= self.cfg.max_window_layers:
            return self.window_decode.run(q, kv)  # expect: FC108
        if self.cfg.use_trtllm_decode:
            return self.trtllm_decode.run(q, kv)  # expect: FC108
        if self.use_tensor_cores:
            return self.tc_decode.run(q, kv)  # expect: FC108
        w = self.decode_wrapper if fb.graph_bs is None else self.graph_wrappers[fb.graph_bs]  # ok: FC101
        return w.run(q, kv)  # ok: FC108
