"""FlashInfer paged backends: graph-mode decode per bucket, and the trtllm-gen and cascade variants."""

from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, MultiLevelCascadeAttentionWrapper

from ccbi import PAGE_SIZE, PREFILL_WORKSPACE_BYTES
from ccbi.config import EngineConfig
from ccbi.forward_batch import ForwardBatch
from ccbi_attn.base import AttentionBackend
from ccbi_attn.workspace import float_workspace, trtllm_workspace

_GRAPH_WS_MIB = {"decode": 96, "verify": 160}
_WS_FIELDS = ("_float_workspace_buffer", "_int_workspace_buffer")


@triton.jit
def fill_kv_indices_kernel(req_to_page, req_pool_indices, page_start, kv_indptr, kv_indices, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    req = tl.load(req_pool_indices + row)
    first = tl.load(page_start + row)
    out = tl.load(kv_indptr + row)
    offs = tl.arange(0, BLOCK)
    mask = offs < tl.load(kv_indptr + row + 1) - out
    tl.store(kv_indices + out + offs, tl.load(req_to_page + req * stride + first + offs, mask=mask), mask=mask)


def fill_kv_indices(req_to_page, req_pool_indices, page_start, kv_indptr, kv_indices, bs: int) -> None:
    block = triton.next_power_of_2(req_to_page.shape[1])
    fill_kv_indices_kernel[(bs,)](req_to_page, req_pool_indices, page_start, kv_indptr, kv_indices, req_to_page.stride(0), BLOCK=block)


def _pages(lens_cpu: torch.Tensor) -> torch.Tensor:
    return (lens_cpu + PAGE_SIZE - 1) // PAGE_SIZE


class FlashInferBackend(AttentionBackend, name="flashinfer"):
    def __init__(self, cfg: EngineConfig, device: torch.device, shared_ws: torch.Tensor):
        super().__init__(cfg, device, shared_ws)
        self.float_ws = float_workspace(cfg.workspace_bytes(), device)
        self.prefill_ws = torch.empty(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.window_ws = torch.empty(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.float_ws, self._kv_layout)  # ok: FC103
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_ws, "NHD", backend="fa2")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD")
        max_bs = cfg.max_batch_size
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.empty(cfg.num_pages, dtype=torch.int32, device=device)
        self.window_indices = torch.empty(cfg.num_pages, dtype=torch.int32, device=device)
        self.page_start = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.window_page_start: Optional[torch.Tensor] = None
        self.window_layers = frozenset(cfg.window_layers)
        self._plan_info: Dict[str, int] = {}

    def _heads(self):
        return self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, PAGE_SIZE

    def init_cuda_graph_state(self, max_bs: int) -> None:
        assert not self.graph_wrappers, "graph state initialised twice"  # ok: FC109
        self.graph_ws = torch.empty(_GRAPH_WS_MIB["decode"] << 20, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * self.cfg.max_pages_per_seq, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len.fill_(1)  # ok: FC104
        self.cuda_graph_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.graph_bufs = {"kv_indptr": self.cuda_graph_kv_indptr, "kv_indices": self.cuda_graph_kv_indices,
                           "last_page_len": self.cuda_graph_last_page_len}
        for bs in (b for b in self.cfg.graph_batch_sizes if b <= max_bs):
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.cuda_graph_kv_indices, paged_kv_last_page_len_buffer=self.cuda_graph_last_page_len[:bs])

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        pages_cpu = _pages(fb.seq_lens_cpu[:bs])
        num_pages = int(pages_cpu.sum())  # ok: FC101
        if self.kv_indices.numel() < num_pages:
            self.kv_indices = torch.empty(2 * num_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        if self.kv_indptr_cpu.numel() < bs + 1:
            self.kv_indptr_cpu = torch.zeros(2 * bs + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(pages_cpu, 0)
        kv_indptr = self.kv_indptr_cpu[: bs + 1].to(self.device, non_blocking=True)
        fill_kv_indices(self.req_to_page, fb.req_pool_indices, self.page_start, kv_indptr, self.kv_indices, bs)  # ok: FC104
        self._plan_info = {"bs": bs, "pages": num_pages, "kv_tokens": fb.total_kv_tokens}  # ok: FC103
        self.last_page_len_cpu[:bs] = (fb.seq_lens_cpu[:bs] - 1) % PAGE_SIZE + 1
        if not fb.is_decode:
            self._plan_prefill(fb)
            return
        self.decode_wrapper.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.last_page_len_cpu[:bs], *self._heads())  # ok: FC102
        if self.window_layers:
            self._plan_window(fb)
        if self.graph_bufs:
            self.graph_bufs["last_page_len"][:bs].copy_(self.last_page_len_cpu[:bs], non_blocking=True)  # expect: FC104

    def _plan_prefill(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        self.prefill_wrapper.plan(  # expect: FC102
            fb.qo_indptr, self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.last_page_len_cpu[:bs], *self._heads(), causal=True)

    def _plan_window(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        if self.window_page_start is None:
            self.window_page_start = torch.zeros(self.cfg.max_batch_size, dtype=torch.int32, device=self.device)  # ok: FC107
        win_pages = _pages(torch.clamp(fb.seq_lens[:bs], max=self.cfg.sliding_window))
        self.window_page_start[:bs] = _pages(fb.seq_lens[:bs]) - win_pages
        win_indptr = F.pad(torch.cumsum(win_pages, 0, dtype=torch.int32), (1, 0))
        fill_kv_indices(self.req_to_page, fb.req_pool_indices, self.window_page_start, win_indptr, self.window_indices, bs)
        self.window_wrapper.plan(  # expect: FC102
            win_indptr, self.window_indices, self.last_page_len_cpu[:bs], *self._heads(), window_left=self.cfg.sliding_window - 1)

    def init_forward_metadata_capture_cuda_graph(self, bs, seq_lens_cpu, req_pool_indices) -> None:
        self.cuda_graph_kv_indptr_cpu[1 : bs + 1] = torch.cumsum(_pages(seq_lens_cpu[:bs]), 0)
        self.cuda_graph_kv_indptr[: bs + 1].copy_(self.cuda_graph_kv_indptr_cpu[: bs + 1])  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.cuda_graph_kv_indptr_cpu[: bs + 1], self.cuda_graph_kv_indices, torch.ones(bs, dtype=torch.int32), *self._heads())

    def init_forward_metadata_replay_cuda_graph(self, bs, seq_lens_cpu, req_pool_indices) -> None:
        assert bs in self.graph_wrappers, f"no decode graph for batch size {bs}"  # expect: FC109
        self.cuda_graph_kv_indptr_cpu[1 : bs + 1] = torch.cumsum(_pages(seq_lens_cpu[:bs]), 0)  # ok: FC104
        self.cuda_graph_kv_indptr[: bs + 1].copy_(self.cuda_graph_kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        fill_kv_indices(self.req_to_page, req_pool_indices, self.page_start, self.cuda_graph_kv_indptr, self.cuda_graph_kv_indices, bs)  # ok: FC104
        self.graph_wrappers[bs].plan(  # expect: FC102
            self.cuda_graph_kv_indptr[: bs + 1], self.cuda_graph_kv_indices, self.cuda_graph_last_page_len[:bs], *self._heads())
        self.cuda_graph_last_page_len[:bs].copy_((seq_lens_cpu[:bs] - 1) % PAGE_SIZE + 1, non_blocking=True)  # expect: FC104

    def forward(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        if fb.is_decode:  # ok: FC101
            return self.forward_decode(q, k, v, layer, fb)
        return self.forward_extend(q, k, v, layer, fb)

    def forward_decode(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        kv = self.kv_cache[layer.layer_id]
        if layer.layer_id in self.window_layers:
            return self.window_wrapper.run(q, kv)  # expect: FC108
        w = self.decode_wrapper if fb.graph_bs is None else self.graph_wrappers[fb.graph_bs]
        return w.run(q, kv)  # ok: FC108

    def forward_extend(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        return self.prefill_wrapper.run(q, self.kv_cache[layer.layer_id])  # ok: FC108

    def reset_padding(self) -> None:
        for bs, w in self.graph_wrappers.items():
            lpl = w._paged_kv_last_page_len_buf  # expect: FC103
            lpl[:bs].fill_(1)  # expect: FC104

    def workspace_report(self) -> Dict[str, int]:
        return {f"bs{bs}{f}": getattr(w, f).numel() for bs, w in self.graph_wrappers.items() for f in _WS_FIELDS}  # expect: FC103


class TrtllmGenBackend(FlashInferBackend, name="trtllm_gen"):
    """Blackwell decode and prefill through the trtllm-gen kernels."""

    def __init__(self, cfg: EngineConfig, device: torch.device, shared_ws: torch.Tensor):
        super().__init__(cfg, device, shared_ws)
        self.trt_ws = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.trt_decode = BatchDecodeWithPagedKVCacheWrapper(self.trt_ws, "NHD", backend="trtllm-gen")
        self.trt_prefill = BatchPrefillWithPagedKVCacheWrapper(trtllm_workspace(cfg.workspace_bytes(), device), "NHD", backend="trtllm-gen")
        self.last_page_len_dev: Optional[torch.Tensor] = None
        self.last_plan: object = None

    def init_cuda_graph_state(self, max_bs: int) -> None:
        super().init_cuda_graph_state(max_bs)
        self.cuda_graph_kv_indices.zero_()  # ok: FC104

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        if max(fb.seq_lens) > self.cfg.max_context_len:  # expect: FC101
            raise ValueError(f"a sequence is longer than max_context_len={self.cfg.max_context_len}")
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(_pages(fb.seq_lens_cpu[:bs]), 0)
        kv_indptr = self.kv_indptr_cpu[: bs + 1].to(self.device, non_blocking=True)
        fill_kv_indices(self.req_to_page, fb.req_pool_indices, self.page_start, kv_indptr, self.kv_indices, bs)
        if not fb.is_decode:
            self.last_page_len_cpu[:bs] = (fb.seq_lens_cpu[:bs] - 1) % PAGE_SIZE + 1
            qo_indptr_cpu = F.pad(torch.cumsum(fb.extend_lens_cpu, 0, dtype=torch.int32), (1, 0))
            self.trt_prefill.plan(  # ok: FC102
                qo_indptr_cpu, self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.last_page_len_cpu[:bs], *self._heads(), causal=True)
            return
        self.last_page_len_dev = torch.empty(bs, dtype=torch.int32, device=self.device)  # expect: FC107
        torch.remainder(fb.seq_lens[:bs] - 1, PAGE_SIZE, out=self.last_page_len_dev)
        self.last_page_len_dev += 1
        self.trt_decode.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.last_page_len_dev, *self._heads())  # expect: FC102
        self.last_plan = self.trt_decode._plan_info  # expect: FC103

    def forward_decode(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        return self.trt_decode.run(q, self.kv_cache[layer.layer_id])  # expect: FC108

    def forward_extend(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        return self.trt_prefill.run(q, self.kv_cache[layer.layer_id])  # ok: FC108


class CascadeBackend(FlashInferBackend, name="flashinfer_cascade"):
    """Level 0 holds the system prompt every request shares, level 1 each request's own pages."""

    WORKSPACE_BYTES = 192 * 1024 * 1024

    def __init__(self, cfg: EngineConfig, device: torch.device, shared_ws: torch.Tensor):
        super().__init__(cfg, device, shared_ws)
        self.cascade_ws = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.cascade_wrapper = MultiLevelCascadeAttentionWrapper(2, self.cascade_ws, "NHD")
        self._num_levels = 2
        self.shared_len = cfg.shared_prefix_len
        n_shared = (self.shared_len + PAGE_SIZE - 1) // PAGE_SIZE
        self.shared_indptr_cpu = torch.tensor([0, n_shared], dtype=torch.int32)
        self.shared_last_cpu = torch.tensor([self.shared_len - (n_shared - 1) * PAGE_SIZE], dtype=torch.int32)
        self.unique_start = torch.full((cfg.max_batch_size,), n_shared, dtype=torch.int32, device=device)
        self.level_indices = {"shared": torch.arange(n_shared, dtype=torch.int32, device=device),
                              "unique": torch.empty(cfg.num_pages, dtype=torch.int32, device=device)}

    def _host_levels(self, bs: int, seq_lens_cpu: torch.Tensor):
        unique_lens = (seq_lens_cpu[:bs] - self.shared_len).clamp(min=1)
        unique_indptr_cpu = F.pad(torch.cumsum(_pages(unique_lens), 0, dtype=torch.int32), (1, 0))
        qo_levels = [torch.tensor([0, bs], dtype=torch.int32), torch.arange(bs + 1, dtype=torch.int32)]
        return qo_levels, unique_indptr_cpu, (unique_lens - 1) % PAGE_SIZE + 1

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if not fb.is_decode:
            super().init_forward_metadata(fb)
            return
        bs = fb.batch_size
        if (fb.seq_lens[:bs] < self.shared_len).any():  # expect: FC101
            raise ValueError(f"cascade decode needs every request past the shared prefix: {fb.seq_lens[:bs]}")  # ok: FC101
        qo_levels, unique_indptr_cpu, unique_last_cpu = self._host_levels(bs, fb.seq_lens_cpu)
        unique_indptr = unique_indptr_cpu.to(self.device, non_blocking=True)
        self.level_indices["unique"] = torch.empty(int(unique_indptr_cpu[-1]), dtype=torch.int32, device=self.device)  # expect: FC107
        fill_kv_indices(self.req_to_page, fb.req_pool_indices, self.unique_start, unique_indptr, self.level_indices["unique"], bs)
        self.cascade_wrapper.plan(  # expect: FC102
            qo_levels, [self.shared_indptr_cpu, unique_indptr], [self.level_indices["shared"], self.level_indices["unique"]],
            [self.shared_last_cpu, unique_last_cpu], *self._heads())

    def init_forward_metadata_replay_cuda_graph(self, bs: int, seq_lens_cpu: torch.Tensor, req_pool_indices: torch.Tensor) -> None:
        qo_levels, unique_indptr_cpu, unique_last_cpu = self._host_levels(bs, seq_lens_cpu)
        unique = self.level_indices["unique"]
        fill_kv_indices(self.req_to_page, req_pool_indices, self.unique_start, unique_indptr_cpu.to(self.device, non_blocking=True), unique, bs)
        self.cascade_wrapper.plan(  # ok: FC102
            qo_levels, [self.shared_indptr_cpu, unique_indptr_cpu], [self.level_indices["shared"], unique],
            [self.shared_last_cpu, unique_last_cpu], *self._heads())

    init_forward_metadata_capture_cuda_graph = init_forward_metadata_replay_cuda_graph

    def forward_decode(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        return self.cascade_wrapper.run(q, self.kv_cache[layer.layer_id])  # expect: FC108

    def describe_levels(self) -> Dict[str, int]:
        out = {"levels": self._num_levels}  # ok: FC103
        for i, w in enumerate(self.cascade_wrapper._batch_prefill_wrappers):  # expect: FC103
            out[f"level{i}_graph"] = int(w.is_cuda_graph_enabled)
        return out
