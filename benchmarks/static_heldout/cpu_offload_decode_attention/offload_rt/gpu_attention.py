"""GPU part of the decode attention: the recent window (graph-mode wrappers per bucket, an eager wrapper past the
buckets) and the attention-sink pages, merged by LSE before the host part is merged in."""

from __future__ import annotations

import functools
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, merge_state

from offattn.batch import OffloadBatch
from offattn.config import OffloadConfig
from offattn.gpu_pool import GPUPagePool
from offattn.workspaces import workspace_for


def _check_layout(w, expected: str) -> None:
    if w._kv_layout != expected:  # expect: FC103
        raise RuntimeError(f"GPU wrapper layout {expected!r} expected; the host pages are stored NHD")


def _wrapper_kwargs(use_trtllm: bool) -> dict:
    kw = {"kv_layout": "NHD"}
    if use_trtllm:
        kw["backend"] = "trtllm-gen"
    return kw


class RecentWindowAttention:
    def __init__(self, cfg: OffloadConfig, pool: GPUPagePool, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.graph_workspace = torch.empty(cfg.gpu_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.eager_workspace = torch.empty(cfg.gpu_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.sink_workspace = workspace_for("sink", device)
        self.eager_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, **_wrapper_kwargs(cfg.use_trtllm_eager))
        self.sink_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.sink_workspace, "NHD")
        self.check_layout = functools.partial(_check_layout, self.eager_wrapper)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.active_bs: Optional[int] = None
        self.init_window_buffers()

    def init_window_buffers(self) -> None:
        cfg, dev = self.cfg, self.device
        mb = cfg.max_bucket
        self.graph_kv_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=dev)
        self.graph_kv_indices = torch.zeros(mb * (cfg.window_pages + 1), dtype=torch.int32, device=dev)
        self.graph_last_page_len = torch.empty(mb, dtype=torch.int32, device=dev)
        self.graph_last_page_len.fill_(cfg.page_size)  # ok: FC104
        self.window_indptr_pinned = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.full((mb,), cfg.page_size, dtype=torch.int32, pin_memory=True)
        self.prev_window_lens = torch.full((mb,), -1, dtype=torch.int32, device=dev)

    def bind_bucket(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.graph_kv_indices,
            paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = w
        return w

    def window_wrapper_for(self, bs: Optional[int]) -> BatchDecodeWithPagedKVCacheWrapper:
        return self.graph_wrappers[bs] if bs in self.graph_wrappers else self.eager_wrapper

    # ------------------------------------------------------------------ plans
    def _plan_sinks(self, batch: OffloadBatch) -> None:
        cfg = self.cfg
        n = batch.num_rows
        self.sink_wrapper.plan(
            torch.from_numpy(batch.sink_indptr_np),
            batch.sink_indices,
            torch.full((n,), cfg.page_size, dtype=torch.int32),
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            data_type=torch.bfloat16,
        )

    def plan_eager(self, batch: OffloadBatch) -> None:
        cfg = self.cfg
        indptr = torch.from_numpy(batch.window_indptr_np).cuda()
        self.eager_wrapper.plan(  # expect: FC102
            indptr,
            batch.window_indices,
            torch.from_numpy(batch.window_last_np),
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            data_type=torch.bfloat16,
        )
        self._plan_sinks(batch)

    def prepare_gpu_replay(self, bs: int, batch: OffloadBatch) -> None:
        cfg = self.cfg
        n = batch.num_rows
        self._plan_sinks(batch)
        if torch.equal(batch.window_lens_dev, self.prev_window_lens[:n]):  # expect: FC101
            return
        self.window_indptr_pinned[: n + 1].copy_(torch.from_numpy(batch.window_indptr_np))
        self.window_indptr_pinned[n + 1 : bs + 1] = int(batch.window_indptr_np[-1])
        self.last_pinned[:n].copy_(torch.from_numpy(batch.window_last_np))
        self.graph_last_page_len[:n].copy_(torch.from_numpy(np.ascontiguousarray(batch.window_last_np)), non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.window_indptr_pinned[: bs + 1],
            batch.window_indices,
            self.last_pinned[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            data_type=torch.bfloat16,
        )
        self.prev_window_lens[:n].copy_(batch.window_lens_dev)

    # ------------------------------------------------------------------ attention
    def forward_gpu_part(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                         batch: OffloadBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        self.pool.write(layer_id, batch.out_loc, k, v)
        kv = (self.pool.k[layer_id], self.pool.v[layer_id])
        w = self.window_wrapper_for(self.active_bs)
        o_win, lse_win = w.run_return_lse(q, kv)  # ok: FC108
        o_sink, lse_sink = self.sink_wrapper.run_return_lse(q, kv)  # expect: FC108
        return merge_state(o_win, lse_win, o_sink, lse_sink)
