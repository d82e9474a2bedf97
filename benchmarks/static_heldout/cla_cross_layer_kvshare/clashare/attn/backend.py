"""FlashInfer attention for cross-layer KV sharing.

Every KV group has its own wrappers: an eager tensor-core decode wrapper, a
paged prefill wrapper, and one graph-mode decode wrapper per captured batch
bucket.  Local groups (sliding window) decode through a window wrapper.  The
page layout of each group is derived on the host from the pool's numpy tables.
"""
from __future__ import annotations

import functools
import logging
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from clashare.attn.plan_cache import GroupPlanCache
from clashare.attn.workspace import make_float_workspace, make_trtllm_workspace
from clashare.config import PREFILL_WORKSPACE_BYTES, CLAConfig
from clashare.groups import LayerGroupMap
from clashare.kv.group_pool import GroupKVPool
from clashare_rt.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

# buffers we account for in the memory report
_WS_FIELDS = ("_float_workspace_buffer", "_int_workspace_buffer")


class CLAFlashInferBackend:
    def __init__(self, cfg: CLAConfig, group_map: LayerGroupMap, pool: GroupKVPool, device: torch.device) -> None:
        self.cfg = cfg
        self.group_map = group_map
        self.pool = pool
        self.device = device
        self.num_groups = group_map.num_groups
        G = self.num_groups
        max_bs = max(cfg.graph_buckets)
        max_idx = max_bs * cfg.max_pages_per_req

        self.workspace = make_float_workspace(cfg, device)
        self.prefill_workspace = torch.zeros(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.trtllm_workspace = make_trtllm_workspace(cfg, device)
        self.graph_workspace: Optional[torch.Tensor] = None

        self.decode_wrappers: List[BatchDecodeWithPagedKVCacheWrapper] = [
            BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True, backend="fa2")
            for _ in range(G)
        ]
        self.prefill_wrappers = [
            BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2") for _ in range(G)
        ]
        self.window_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            g: BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True, backend="fa2")
            for g in group_map.local_groups()
        }

        # graph-bound buffers, one row per group
        self.graph_kv_indptr = torch.zeros((G, max_bs + 1), dtype=torch.int32, device=device)
        self.graph_kv_indices = torch.zeros((G, max_idx), dtype=torch.int32, device=device)
        self.graph_kv_last_page_len = torch.ones((G, max_bs), dtype=torch.int32, device=device)
        # pinned host mirrors that plan() reads
        self.kv_indptr_cpu = torch.zeros((G, max_bs + 1), dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros((G, max_idx), dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones((G, max_bs), dtype=torch.int32, pin_memory=True)

        self.graph_wrappers: Dict[int, List[BatchDecodeWithPagedKVCacheWrapper]] = {}
        self.graph_bs: Optional[int] = None
        self.plan_cache = GroupPlanCache()
        self.window_indices_dev: Optional[torch.Tensor] = None
        self.decode_positions: Optional[torch.Tensor] = None
        self.seq_lens_host: Optional[torch.Tensor] = None
        self.sm_scale = cfg.head_dim ** -0.5

    # ------------------------------------------------------------------ set-up
    def init_cuda_graph_state(self) -> None:
        self.graph_workspace = torch.zeros(self.cfg.decode_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC106
        self.graph_kv_last_page_len.fill_(1)  # ok: FC104
        for bs in self.cfg.graph_buckets:
            self.graph_wrappers[bs] = [
                BatchDecodeWithPagedKVCacheWrapper(
                    self.graph_workspace,
                    "NHD",
                    use_cuda_graph=True,
                    use_tensor_cores=True,
                    paged_kv_indptr_buffer=self.graph_kv_indptr[g, : bs + 1],
                    paged_kv_indices_buffer=self.graph_kv_indices[g],
                    paged_kv_last_page_len_buffer=self.graph_kv_last_page_len[g, :bs],
                )
                for g in range(self.num_groups)
            ]

    def _plan_kwargs(self) -> dict:
        return dict(
            num_qo_heads=self.cfg.num_q_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim,
            page_size=self.cfg.page_size,
            q_data_type=self.cfg.dtype,
        )

    # ---------------------------------------------------------------- per step
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        self.graph_bs = None
        if fb.is_decode:
            self._plan_decode_groups(fb)
        else:
            self._plan_prefill_groups(fb)
        self.decode_positions = torch.zeros(fb.batch_size, dtype=torch.int64, device=self.device)  # expect: FC107
        self.decode_positions.copy_(torch.where(fb.seq_lens > 0, fb.seq_lens - 1, torch.zeros_like(fb.seq_lens)))  # ok: FC101
        self.seq_lens_host = torch.empty(fb.batch_size, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.seq_lens_host.copy_(fb.seq_lens_cpu)

    def _plan_decode_groups(self, fb: ForwardBatch) -> None:
        rows = fb.req_rows_cpu.numpy()
        lens = fb.seq_lens_cpu.numpy()
        max_len = int(fb.seq_lens_cpu.max())  # ok: FC101
        fb.use_trtllm = max_len > self.cfg.long_context_threshold
        logger.debug("cla decode: %d groups, seq_lens=%s", self.num_groups, fb.seq_lens)  # ok: FC101
        for g in range(self.num_groups):
            indptr_np, indices_np, last_np = self.pool.host_page_layout(g, rows, lens)
            if self.group_map.is_local(g):
                self._plan_window_group(g, fb, indptr_np, indices_np, last_np)
                continue
            if self.plan_cache.same(g, (len(rows), int(indptr_np[-1]), int(last_np.sum()))):
                continue
            indptr_dev = torch.from_numpy(indptr_np).to(self.device, non_blocking=True)
            indices_dev = torch.from_numpy(indices_np).to(self.device, non_blocking=True)
            plan = functools.partial(self.decode_wrappers[g].plan, **self._plan_kwargs())
            plan(indptr_dev, indices_dev, torch.from_numpy(last_np))  # expect: FC102

    def _plan_window_group(
        self, g: int, fb: ForwardBatch, indptr_np: np.ndarray, indices_np: np.ndarray, last_np: np.ndarray
    ) -> None:
        # the window only matters once some request outgrew it
        longest = int(fb.seq_lens.max())  # expect: FC101
        if longest > self.cfg.local_window:
            self.pool.slide_window(g, fb.req_rows_cpu.numpy(), fb.seq_lens_cpu.numpy())
            indptr_np, indices_np, last_np = self.pool.host_page_layout(
                g, fb.req_rows_cpu.numpy(), fb.seq_lens_cpu.numpy()
            )
        n = int(indptr_np[-1])
        if self.window_indices_dev is None or self.window_indices_dev.numel() < n:
            self.window_indices_dev = torch.empty(max(n, 4096), dtype=torch.int32, device=self.device)  # expect: FC107
        self.window_indices_dev[:n].copy_(torch.from_numpy(indices_np), non_blocking=True)
        self.window_wrappers[g].plan(  # ok: FC102
            torch.from_numpy(indptr_np),
            self.window_indices_dev[:n],
            torch.from_numpy(last_np),
            window_left=self.cfg.local_window - 1,
            **self._plan_kwargs(),
        )

    def _plan_prefill_groups(self, fb: ForwardBatch) -> None:
        rows = fb.req_rows_cpu.numpy()
        lens = fb.seq_lens_cpu.numpy()
        for g in range(self.num_groups):
            indptr_np, indices_np, last_np = self.pool.host_page_layout(g, rows, lens)
            window_left = self.cfg.local_window - 1 if self.group_map.is_local(g) else -1
            self.prefill_wrappers[g].plan(  # expect: FC102
                fb.qo_indptr,
                torch.from_numpy(indptr_np),
                torch.from_numpy(indices_np).to(self.device),
                torch.from_numpy(last_np),
                self.cfg.num_q_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.cfg.page_size,
                causal=True,
                window_left=window_left,
                q_data_type=self.cfg.dtype,
            )

    # ----------------------------------------------------------- graph capture
    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.graph_bs = bs
        for g in range(self.num_groups):
            if self.group_map.is_local(g):
                indptr = np.arange(bs + 1, dtype=np.int32)
                self._plan_window_group(g, fb, indptr, np.zeros(bs, np.int32), np.ones(bs, np.int32))
                continue
            self.graph_wrappers[bs][g].plan(
                self.kv_indptr_cpu[g, : bs + 1],
                self.kv_indices_cpu[g, :bs],
                self.kv_last_page_len_cpu[g, :bs],
                **self._plan_kwargs(),
            )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.graph_bs = bs
        n_live = fb.batch_size
        rows = fb.req_rows_cpu.numpy()
        lens = fb.seq_lens_cpu.numpy()
        for g in range(self.num_groups):
            indptr_np, indices_np, last_np = self.pool.host_page_layout(g, rows, lens)
            if self.group_map.is_local(g):
                self._plan_window_group(g, fb, indptr_np, indices_np, last_np)
                continue
            n = int(indptr_np[-1])
            self.kv_indptr_cpu[g, : n_live + 1].copy_(torch.from_numpy(indptr_np))
            self.kv_indptr_cpu[g, n_live + 1 : bs + 1] = n
            self.kv_indices_cpu[g, :n].copy_(torch.from_numpy(indices_np))
            self.kv_last_page_len_cpu[g, :n_live].copy_(torch.from_numpy(last_np))
            self.graph_kv_indptr[g, : bs + 1].copy_(self.kv_indptr_cpu[g, : bs + 1], non_blocking=True)  # ok: FC104
            self.graph_kv_indices[g, :n].copy_(self.kv_indices_cpu[g, :n], non_blocking=True)
            self.graph_wrappers[bs][g].plan(  # ok: FC102
                self.kv_indptr_cpu[g, : bs + 1],
                self.kv_indices_cpu[g, :n],
                self.kv_last_page_len_cpu[g, :bs],
                **self._plan_kwargs(),
            )
        # the pinned mirror starts every step from full last pages
        self.kv_last_page_len_cpu[:, :bs].fill_(1)  # ok: FC104

    # ----------------------------------------------------------------- forward
    def forward_decode(
        self, layer_id: int, q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], fb: ForwardBatch
    ) -> torch.Tensor:
        g = self.group_map.group_of(layer_id)
        if k is not None:
            self.pool.append_kv(layer_id, k, v, fb.out_cache_loc)
        kv = self.pool.group_cache(g)
        if self.group_map.is_local(g):
            return self.window_wrappers[g].run(q, kv)  # expect: FC108
        if self.graph_bs is None and fb.use_trtllm:
            return self._trtllm_decode(g, q, kv, fb)
        w = self.decode_wrappers[g] if self.graph_bs is None else self.graph_wrappers[self.graph_bs][g]
        return w.run(q, kv)  # ok: FC108

    def _trtllm_decode(self, g: int, q: torch.Tensor, kv: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        block_tables = self.pool.page_table_dev[g].index_select(0, fb.req_rows)
        return trtllm_batch_decode_with_kv_cache(
            q,
            kv,
            self.trtllm_workspace,
            block_tables,
            fb.seq_lens,
            fb.max_seq_len_cpu,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
        )

    def forward_extend(
        self, layer_id: int, q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], fb: ForwardBatch
    ) -> torch.Tensor:
        g = self.group_map.group_of(layer_id)
        if k is not None:
            self.pool.append_kv(layer_id, k, v, fb.out_cache_loc)
        return self.prefill_wrappers[g].run(q, self.pool.group_cache(g))

    # ------------------------------------------------------------------- admin
    def workspace_report(self) -> Dict[str, int]:
        total = 0
        for w in self.decode_wrappers + self.prefill_wrappers:
            for name in _WS_FIELDS:
                total += getattr(w, name).numel()  # expect: FC103
        return {"wrapper_workspace_bytes": total, "plan_cache_hits": self.plan_cache.hits}
