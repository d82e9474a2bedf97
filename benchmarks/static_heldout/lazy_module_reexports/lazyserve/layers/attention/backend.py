"""FlashInfer attention backend.

Eager path: one decode wrapper (FA2, or trtllm-gen on Blackwell), one decode wrapper for
the sliding-window layers and one paged prefill wrapper, planned every step in
``init_forward_metadata``. Graph path: one graph-mode decode wrapper per captured batch
size, bound to the ``cuda_graph_*`` buffers and planned again before every replay.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from ...batch import ForwardBatch
from ...config import EngineConfig
from ...utils import (
    GRAPH_WORKSPACE_BYTES,
    alloc_workspace,
    cdiv,
    device_i32,
    fill_kv_indices,
    kv_indptr_from_lens,
    num_pages_in_batch,
    pinned_i32,
    window_kv_indices,
)
from . import plan as fi_plan

logger = logging.getLogger(__name__)


def allocate_kv_cache(cfg: EngineConfig, device: torch.device, layout: str = "NHD") -> List[torch.Tensor]:
    if layout == "NHD":
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
    else:
        shape = (cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim)
    return [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]


class FlashInferBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self.sliding_window = cfg.sliding_window
        self.window_layers = frozenset(cfg.sliding_window_layers)
        self.dims = fi_plan.PlanDims(cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self._kv_layout = "NHD"
        self._plan_info: Optional[tuple] = None  # ok: FC103
        self.decode_backend = "trtllm-gen" if cfg.decode_kernel == "trtllm-gen" else "fa2"

        self.kv_cache = allocate_kv_cache(cfg, device, self._kv_layout)
        # fp8 KV keeps one scale per page; reset when a page is freed
        self.k_scale = torch.ones(cfg.num_pages, dtype=torch.float32, device=device)
        self.v_scale = torch.ones(cfg.num_pages, dtype=torch.float32, device=device)

        max_bs = cfg.max_batch_size
        # pinned mirrors: what the planner reads
        self.kv_indptr_host = pinned_i32(max_bs + 1)
        self.kv_last_page_len_host = pinned_i32(max_bs)
        self.kv_indices_host = pinned_i32(cfg.num_pages)
        self.window_indptr_host = pinned_i32(max_bs + 1)
        self.window_indices_host = pinned_i32(cfg.num_pages)
        # device index buffers of the eager wrappers
        self.kv_indices = device_i32(cfg.num_pages, device)
        self.window_indices = device_i32(cfg.num_pages, device)

        self.decode_workspace = alloc_workspace(cfg.decode_workspace_bytes, device)
        self.prefill_workspace = alloc_workspace(cfg.prefill_workspace_bytes(), device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, self._kv_layout, backend=self.decode_backend
        )
        self.window_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)

        # CUDA-graph state, filled by init_cuda_graph_state()
        self.graph_workspace: Optional[torch.Tensor] = None
        self.cuda_graph_kv_indptr: Optional[torch.Tensor] = None
        self.cuda_graph_kv_indices: Optional[torch.Tensor] = None
        self.cuda_graph_kv_last_page_len: Optional[torch.Tensor] = None
        self.graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._last_replay_key: Optional[tuple] = None

    # ------------------------------------------------------------------ eager
    def warmup_eager(self, q: torch.Tensor) -> None:
        """Run one eager decode at start-up so the first request does not pay for JIT loading."""
        self.kv_indptr_host[:2] = torch.tensor([0, 1], dtype=torch.int32)
        self.kv_last_page_len_host[:1] = 1
        fi_plan.plan_decode(self.decode_wrapper, self.kv_indptr_host[:2], self.kv_indices[:1], self.kv_last_page_len_host[:1], self.dims)
        self.decode_wrapper.run(q[:1], self.kv_cache[0])  # ok: FC108

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        seq_lens_np = fb.seq_lens_cpu.numpy()[:bs]  # ok: FC101
        total = kv_indptr_from_lens(seq_lens_np, self.page_size, self.kv_indptr_host.numpy())
        fill_kv_indices(fb.page_table_np, seq_lens_np, self.page_size, self.kv_indices_host.numpy())
        self.kv_last_page_len_host.numpy()[:bs] = (seq_lens_np - 1) % self.page_size + 1

        if fb.forward_mode.is_decode():
            self.kv_indices[:total].copy_(self.kv_indices_host[:total], non_blocking=True)
            fi_plan.plan_decode(
                self.decode_wrapper,
                self.kv_indptr_host[: bs + 1],
                self.kv_indices[:total],
                self.kv_last_page_len_host[:bs],
                self.dims,
            )
            if self.window_layers:
                clip = fi_plan.window_needed(fb.seq_lens, self.sliding_window)
                self._plan_window(fb, seq_lens_np, clip)
        else:
            n_pages = num_pages_in_batch(fb.seq_lens, self.page_size)
            kv_indices = self.kv_indices[:n_pages]
            kv_indices.copy_(self.kv_indices_host[:n_pages], non_blocking=True)
            fi_plan.plan_prefill(
                self.prefill_wrapper,
                fb.qo_indptr,
                self.kv_indptr_host[: bs + 1],
                kv_indices,
                self.kv_last_page_len_host[:bs],
                self.dims,
            )
        self._plan_info = (bs, total)  # ok: FC103

    def _plan_window(self, fb: ForwardBatch, seq_lens_np, clip: bool) -> None:
        bs = fb.batch_size
        window_pages = cdiv(self.sliding_window, self.page_size) + 1 if clip else self.cfg.max_pages_per_seq()
        n = window_kv_indices(
            fb.page_table_np,
            seq_lens_np,
            self.page_size,
            window_pages,
            self.window_indptr_host.numpy(),
            self.window_indices_host.numpy(),
        )
        self.window_indices[:n].copy_(self.window_indices_host[:n], non_blocking=True)
        fi_plan.plan_decode(
            self.window_decode_wrapper,
            self.window_indptr_host[: bs + 1],
            self.window_indices[:n],
            self.kv_last_page_len_host[:bs],
            self.dims,
            window_left=self.sliding_window - 1,
        )

    # ------------------------------------------------------------ CUDA graphs
    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.graph_workspace = torch.zeros(GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106  # ok: FC105
        self.cuda_graph_kv_indptr = device_i32(max_bs + 1, self.device)
        self.cuda_graph_kv_indices = device_i32(self.cfg.num_pages, self.device)
        self.cuda_graph_kv_last_page_len = device_i32(max_bs, self.device)
        self.cuda_graph_kv_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        wrapper = fi_plan.DecodeWrapper(
            self.graph_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_kv_last_page_len[:bs],
            backend=self.decode_backend,
        )
        self.graph_decode_wrappers[bs] = wrapper
        # dummy batch for the capture: every row holds one token in page 0
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_last_page_len_host[:bs] = 1
        self.cuda_graph_kv_indices[:bs].zero_()  # ok: FC104
        fi_plan.plan_decode(
            wrapper,
            self.kv_indptr_host[: bs + 1],
            self.cuda_graph_kv_indices[:bs],
            self.kv_last_page_len_host[:bs],
            self.dims,
        )
        self._last_replay_key = None
        fb.graph_bs = bs

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        raw_bs = fb.batch_size
        seq_lens_np = fb.seq_lens_cpu.numpy()[:raw_bs]
        indptr_np = self.kv_indptr_host.numpy()
        total = kv_indptr_from_lens(seq_lens_np, self.page_size, indptr_np)
        indptr_np[raw_bs + 1 : bs + 1] = total  # padded rows hold no pages
        self.kv_last_page_len_host.numpy()[:raw_bs] = (seq_lens_np - 1) % self.page_size + 1

        # Same requests and the same page count as the previous replay: the page ids in
        # the bound buffer are still right (pages are only ever appended).
        key = (bs, fb.req_ids, total)
        if key != self._last_replay_key:
            fill_kv_indices(fb.page_table_np, seq_lens_np, self.page_size, self.kv_indices_host.numpy())
            self.cuda_graph_kv_indices[:total].copy_(self.kv_indices_host[:total], non_blocking=True)  # ok: FC104

        fi_plan.plan_decode(
            self.graph_decode_wrappers[bs],
            self.kv_indptr_host[: bs + 1],
            self.cuda_graph_kv_indices[:total],
            self.kv_last_page_len_host[:bs],
            self.dims,
        )
        if self.window_layers:
            self._plan_window(fb, seq_lens_np, True)
        # padded rows attend to a single (masked) token
        self.cuda_graph_kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
        self._last_replay_key = key

    # ---------------------------------------------------------------- forward
    def _store_kv(self, kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        page = torch.div(loc, self.page_size, rounding_mode="floor")
        slot = loc % self.page_size
        kv[page, 0, slot] = k
        kv[page, 1, slot] = v

    def forward_decode(self, q, k, v, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        kv = self.kv_cache[layer_id]
        self._store_kv(kv, k, v, fb.out_cache_loc)
        if layer_id in self.window_layers:
            return self.window_decode_wrapper.run(q, kv)  # expect: FC108
        wrapper = self.graph_decode_wrappers[fb.graph_bs] if fb.graph_bs is not None else self.decode_wrapper
        return wrapper.run(q, kv)  # ok: FC108

    def forward_extend(self, q, k, v, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        kv = self.kv_cache[layer_id]
        self._store_kv(kv, k, v, fb.out_cache_loc)
        return self.prefill_wrapper.run(q, kv)

    # ------------------------------------------------------------ diagnostics
    def plan_summary(self) -> dict:
        summary = {"eager_plan": self._plan_info}  # ok: FC103
        summary["decode_plan"] = self.decode_wrapper._plan_info  # expect: FC103
        summary["workspace_bytes"] = sum(
            fi_plan.workspace_bytes_in_use(w)
            for w in (self.decode_wrapper, self.window_decode_wrapper, self.prefill_wrapper)
        )
        return summary

    def debug_dump(self, bs: int) -> dict:
        """Bound graph buffers of bucket ``bs``, for tests and bug reports."""
        return {
            "kv_indptr": self.cuda_graph_kv_indptr[: bs + 1].tolist(),  # ok: FC101
            "kv_last_page_len": self.cuda_graph_kv_last_page_len[:bs].tolist(),
        }


BACKEND_CLS = FlashInferBackend
