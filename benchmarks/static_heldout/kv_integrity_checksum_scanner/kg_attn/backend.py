"""Decode attention: graph-mode wrappers per bucket, an eager trtllm-gen path, a shadow verifier."""
from __future__ import annotations

from typing import Dict, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from kvguard import IntegrityConfig

from .meta import StepMeta
from .workspace import cached_workspace


class ScannerBackend:
    PREFILL_WS_BYTES = 384 * 1024 * 1024

    def __init__(self, cfg: IntegrityConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.graph_workspace = torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_workspace = torch.zeros(self.PREFILL_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.verify_workspace = torch.zeros(cfg.max_batch * cfg.num_qo_heads * cfg.head_dim * 8,  # ok: FC106
                                            dtype=torch.uint8, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages_per_step, dtype=torch.int32, device=device)
        self.kv_indptr: Dict[int, torch.Tensor] = {}
        self.kv_last_page_len: Dict[int, torch.Tensor] = {}
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in cfg.buckets:
            self.kv_indptr[bs] = torch.zeros(bs + 1, dtype=torch.int32, device=device)
            self.kv_last_page_len[bs] = torch.ones(bs, dtype=torch.int32, device=device)
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[bs],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[bs],
            )
        self.eager_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            cached_workspace("eager", cfg.eager_workspace_bytes(), device),
            "NHD",
            backend="trtllm-gen" if cfg.use_trtllm_eager else "fa2",
        )
        self.verify_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.verify_workspace, "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.verify_err = torch.zeros((), dtype=torch.float32, device=device)
        self._plan_info: Dict[int, Tuple[int, int]] = {}
        self.active_bs = 0
        self.eager_mode = False
        self.init_graph_buffers()

    def init_graph_buffers(self) -> None:
        for bs, last in self.kv_last_page_len.items():
            last.fill_(self.cfg.page_size)  # ok: FC104

    def _plan_args(self) -> Tuple[int, int, int, int]:
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def plan_capture(self, bs: int) -> None:
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        last_cpu = torch.ones(bs, dtype=torch.int32)
        self.graph_wrappers[bs].plan(indptr_cpu, self.kv_indices[:bs], last_cpu, *self._plan_args())
        self.active_bs = bs

    def prepare_bucket(self, bs: int, meta: StepMeta) -> None:
        n = meta.batch_size
        w = self.graph_wrappers[bs]
        self.kv_indptr[bs].copy_(meta.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[: meta.num_pages].copy_(meta.kv_indices, non_blocking=True)
        if self.cfg.shadow_verify:
            self.verify_wrapper.plan(meta.kv_indptr_cpu[: n + 1], meta.kv_indices, meta.kv_last_page_len_cpu[:n],
                                     *self._plan_args())
        if meta.rebuilt is not None:
            table = meta.rebuilt
            w.plan(table.indptr[: bs + 1], table.indices, table.last_page_len_host[:bs],  # expect: FC102
                   *self._plan_args())
        else:
            w.plan(meta.kv_indptr_cpu[: bs + 1], meta.kv_indices, meta.kv_last_page_len_cpu[:bs],  # ok: FC102
                   *self._plan_args())
        self._plan_info[bs] = (n, meta.num_pages)  # ok: FC103
        self.kv_last_page_len[bs][n:].fill_(1)  # expect: FC104
        self.active_bs = bs
        self.eager_mode = False

    def plan_eager(self, meta: StepMeta) -> None:
        n = meta.batch_size
        self.eager_wrapper.plan(meta.kv_indptr_cpu[: n + 1], meta.kv_indices, meta.kv_last_page_len_cpu[:n],  # ok: FC102
                                *self._plan_args())
        self.eager_mode = True

    def remap_quarantined(self, old_page: int, new_page: int) -> None:
        self.kv_indices.masked_fill_(self.kv_indices == old_page, new_page)  # expect: FC104
        for w in self.graph_wrappers.values():
            w._plan_info = None  # expect: FC103

    def decode(self, q: torch.Tensor, kv_layer: torch.Tensor) -> torch.Tensor:
        w = self.eager_wrapper if self.eager_mode else self.graph_wrappers[self.active_bs]
        out = w.run(q, kv_layer)  # ok: FC108
        if self.cfg.shadow_verify:
            ref = self.verify_wrapper.run(q, kv_layer)  # expect: FC108
            torch.maximum(self.verify_err, (out - ref).abs().amax(), out=self.verify_err)
        return out

    def prefill(self, q: torch.Tensor, kv_layer: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_layer)
