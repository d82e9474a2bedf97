"""Window / global / random decode wrappers, eager and graph mode, and the window prefill."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)

from bbserve.attn.dense import dense_decode, init_dense_workspace
from bbserve.config import _WS_TIERS, EngineConfig
from bbserve.engine.batch import DecodeBatch, PrefillBatch
from bbserve.sparse.compat import _INDICES_FIELD


class WindowDecodeWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """A decode wrapper that reports the window it was planned with (for the metrics page)."""

    def window(self) -> int:
        return self._window_left  # expect: FC103


def window_layout(batch: DecodeBatch, window_pages: int, page_size: int, pad_to: int):
    """Host indptr / indices / last-page lengths of every row's window pages."""
    bs = batch.batch_size
    n_pages = (batch.seq_lens_np + page_size - 1) // page_size
    first = np.maximum(n_pages - window_pages, 0)
    counts = np.zeros(pad_to, dtype=np.int32)
    counts[:bs] = n_pages - first
    indptr = np.zeros(pad_to + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    idx = np.concatenate([batch.page_table_np[b, first[b] : n_pages[b]] for b in range(bs)]).astype(np.int32)
    last = np.ones(pad_to, dtype=np.int32)
    last[:bs] = (batch.seq_lens_np - 1) % page_size + 1
    return torch.from_numpy(indptr), torch.from_numpy(idx), torch.from_numpy(last)


class WindowGlobalBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self.window = cfg.window
        self._sm_scale = cfg.head_dim ** -0.5  # ok: FC103
        self.graph_bs: Optional[int] = None
        self.dense_mode = False
        self.dense_seq_lens: Optional[torch.Tensor] = None
        self.dense_block_tables: Optional[torch.Tensor] = None
        self.dense_max_len = 0

        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        self.graph_workspaces = [torch.zeros(_WS_TIERS["global"], dtype=torch.uint8, device=self.device) for _ in range(2)]  # expect: FC106
        self.eager_workspaces = {
            name: torch.zeros(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=self.device)
            for name in ("window", "global", "random")
        }
        init_dense_workspace(cfg.dense_workspace_bytes(), self.device)

        self.window_eager = WindowDecodeWrapper(self.eager_workspaces["window"], "NHD")
        self.global_eager = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspaces["global"], "NHD")
        self.random_eager = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspaces["random"], "NHD")
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")

        max_bs = cfg.max_graph_bs
        self.win_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.win_kv_indices = torch.zeros(max_bs * cfg.window_pages, dtype=torch.int32, device=self.device)
        self.win_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.glob_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.glob_kv_indices = torch.zeros(max_bs * cfg.max_global_pages, dtype=torch.int32, device=self.device)
        self.glob_last_page_len = torch.full((max_bs,), cfg.page_size, dtype=torch.int32, device=self.device)
        self.win_kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.win_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.glob_kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.glob_last_page_len_host = torch.full((max_bs,), cfg.page_size, dtype=torch.int32, pin_memory=True)
        self.window_graph: Dict[int, WindowDecodeWrapper] = {}
        self.global_graph: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    # -- set-up ------------------------------------------------------------------------

    def init_graph_wrappers(self, batch_sizes) -> None:
        for bs in batch_sizes:
            self.window_graph[bs] = WindowDecodeWrapper(
                self.graph_workspaces[0],
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.win_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.win_kv_indices,
                paged_kv_last_page_len_buffer=self.win_last_page_len[:bs],
            )
            self.global_graph[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspaces[1],
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.glob_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.glob_kv_indices,
                paged_kv_last_page_len_buffer=self.glob_last_page_len[:bs],
            )

    def graph_buffer_ptrs(self) -> Dict[int, int]:
        """Addresses of the indices each graph wrapper holds (checked against capture time)."""
        return {bs: getattr(w, _INDICES_FIELD).data_ptr() for bs, w in self.global_graph.items()}  # expect: FC103

    # -- planning ----------------------------------------------------------------------

    def _decode_plan_args(self):
        c = self.cfg
        return (c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size)

    def plan_prefill(self, batch: PrefillBatch) -> None:
        c = self.cfg
        self.ragged.plan(  # expect: FC102
            batch.cu_seqlens,
            batch.cu_seqlens,
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            causal=True,
            window_left=self.window - 1,
            sm_scale=self._sm_scale,
        )

    def prepare_replay(self, bs: int, batch: DecodeBatch) -> None:
        indptr_cpu, indices_cpu, last_cpu = window_layout(batch, self.cfg.window_pages, self.page_size, pad_to=bs)
        self.win_kv_indptr_host[: bs + 1].copy_(indptr_cpu)
        self.win_last_page_len_host[:bs].copy_(last_cpu)
        self.win_kv_indptr[: bs + 1].copy_(self.win_kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.win_kv_indices[: indices_cpu.shape[0]].copy_(indices_cpu, non_blocking=True)
        self.window_graph[bs].plan(  # ok: FC102
            self.win_kv_indptr_host[: bs + 1],
            self.win_kv_indices,
            self.win_last_page_len_host[:bs],
            *self._decode_plan_args(),
            window_left=self.window - 1,
            sm_scale=self._sm_scale,
        )

    def plan_global(self, bs: int, batch: DecodeBatch, sel) -> None:
        raw = batch.batch_size
        self.glob_kv_indptr_host.zero_()
        np.cumsum(sel.counts_cpu, out=self.glob_kv_indptr_host[1 : raw + 1].numpy())
        self.glob_kv_indptr_host[raw + 1 : bs + 1] = self.glob_kv_indptr_host[raw]
        self.glob_last_page_len_host[:bs].fill_(self.page_size)
        self.glob_last_page_len[:bs].copy_(self.glob_last_page_len_host[:bs], non_blocking=True)  # ok: FC104
        self.global_graph[bs].plan(  # ok: FC102
            self.glob_kv_indptr_host[: bs + 1],
            self.glob_kv_indices,
            self.glob_last_page_len_host[:bs],
            *self._decode_plan_args(),
            sm_scale=self._sm_scale,
        )
        self._plan_random(bs, batch, sel)

    def _plan_random(self, bs: int, batch: DecodeBatch, sel) -> None:
        raw = batch.batch_size
        indptr = np.full(bs + 1, sel.random_indptr_cpu[-1], dtype=np.int32)
        indptr[: raw + 1] = sel.random_indptr_cpu
        self.random_eager.plan(
            torch.from_numpy(indptr),
            torch.from_numpy(sel.random_pages_cpu).to(self.device, non_blocking=True),
            torch.full((bs,), self.page_size, dtype=torch.int32),
            *self._decode_plan_args(),
            sm_scale=self._sm_scale,
        )

    def plan_eager(self, batch: DecodeBatch, sel) -> None:
        bs = batch.batch_size
        self.dense_mode = batch.max_seq_len <= self.window
        if self.dense_mode:
            self.dense_seq_lens = batch.seq_lens
            self.dense_block_tables = batch.page_table
            self.dense_max_len = batch.max_seq_len
            return
        indptr_cpu, indices_cpu, last_cpu = window_layout(batch, self.cfg.window_pages, self.page_size, pad_to=bs)
        self.window_eager.plan(
            indptr_cpu,
            indices_cpu.to(self.device, non_blocking=True),
            last_cpu,
            *self._decode_plan_args(),
            window_left=self.window - 1,
            sm_scale=self._sm_scale,
        )
        glob_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(sel.counts_cpu, out=glob_indptr[1:])
        self.global_eager.plan(
            torch.from_numpy(glob_indptr),
            sel.page_ids,
            torch.full((bs,), self.page_size, dtype=torch.int32),
            *self._decode_plan_args(),
            sm_scale=self._sm_scale,
        )
        self._plan_random(bs, batch, sel)

    # -- kernels -----------------------------------------------------------------------

    def forward_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged.run(q, k, v)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        if self.dense_mode:
            return dense_decode(
                q, kv_cache, self.dense_block_tables, self.dense_seq_lens, self.dense_max_len, self._sm_scale
            )
        graph = self.graph_bs is not None
        win = self.window_graph.get(bs) if graph else self.window_eager
        o_w, s_w = win.run(q, kv_cache, return_lse=True)  # ok: FC108
        glob = self.global_graph[bs] if graph else self.global_eager
        o_g, s_g = glob.run(q, kv_cache, return_lse=True)
        o_r, s_r = self.random_eager.run(q, kv_cache, return_lse=True)  # expect: FC108
        o, s = merge_state(o_w, s_w, o_g, s_g)
        o, _ = merge_state(o, s, o_r, s_r)
        return o
