"""Blackwell decode backend: trtllm-gen kernels behind FlashInfer's decode wrapper.

Prefill goes straight to ``trtllm_batch_context_with_kv_cache``.  The page-table
descriptors, the pinned mirrors and the planners' float workspace are inherited from
``AttnBackendBase``, declared there once for every backend.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from descserve_kernels.paged_ops import PagedKVPool

from . import config as engine_config
from .attn_base import AttnBackendBase
from .config import EngineConfig
from .descriptors import DeviceBuffer, HostView, PinnedMirror, ZeroedWorkspace
from .forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


class TrtllmDecodeBackend(AttnBackendBase):
    _backend = "trtllm-gen"
    _kv_layout = "HND"

    # graph-mode trtllm-gen wrappers keep their multi-CTA counters in the workspace
    graph_workspace = ZeroedWorkspace(lambda o: o.cfg.workspace_bytes())
    block_tables = DeviceBuffer(lambda o: (o.max_bs, o.max_pages_per_req))
    cu_kv_lens = DeviceBuffer(lambda o: o.max_bs + 1)
    cu_kv_lens_cpu = PinnedMirror(lambda o: o.max_bs + 1)
    cu_kv_lens_np = HostView("cu_kv_lens_cpu")

    def __init__(self, cfg: EngineConfig, kv_pool: PagedKVPool, req_to_page: torch.Tensor, device: torch.device) -> None:
        super().__init__(cfg, kv_pool, req_to_page, device)
        self._eager = BatchDecodeWithPagedKVCacheWrapper(self.float_workspace, self.kv_layout, backend="trtllm-gen")
        self.swa_workspace = torch.zeros(engine_config.SWA_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # ok: FC106
        self._swa = BatchDecodeWithPagedKVCacheWrapper(self.swa_workspace, self.kv_layout, backend="trtllm-gen")
        self._context_ws: Optional[torch.Tensor] = None
        self._kv_tokens = 0

    @property
    def context_workspace(self) -> torch.Tensor:
        if self._context_ws is None:
            self._context_ws = torch.empty(self.cfg.workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105
        return self._context_ws

    def all_wrappers(self) -> List[Any]:
        return [self._eager, self._swa, *self.graph_wrappers.values()]

    def _plan_decode(self, wrapper: BatchDecodeWithPagedKVCacheWrapper, bs: int, total: int, window_left: int = -1) -> None:
        wrapper.plan(
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices[:total],
            self.last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            window_left=window_left,
            q_data_type=torch.bfloat16,
        )

    # -- per-step metadata ----------------------------------------------------------------

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        if fb.forward_mode.is_decode():
            # eager decode only sees batches larger than every captured size
            total = self._stage_page_table(bs, fb.seq_lens_cpu, fb.req_pool_indices)
            self._plan_decode(self._eager, bs, total)
            if self.has_window_layers:
                self._plan_decode(self._swa, bs, total, window_left=self.sliding_window)
            return
        # the context kernel takes block tables and cumulative kv lengths on the device
        self._kv_tokens = fb.seq_lens_sum_cpu
        if self._kv_tokens > self.cfg.num_pages * self.page_size:
            raise RuntimeError(f"batch holds {self._kv_tokens} kv tokens, the pool {self.cfg.num_pages * self.page_size}")
        self.cu_kv_lens_np[0] = 0
        np.cumsum(fb.seq_lens_cpu[:bs].numpy(), out=self.cu_kv_lens_np[1 : bs + 1])
        self.cu_kv_lens[: bs + 1].copy_(self.cu_kv_lens_cpu[: bs + 1], non_blocking=True)
        self.block_tables[:bs] = self.req_to_page[fb.req_pool_indices]

    # -- CUDA graphs --------------------------------------------------------------------------

    def init_cuda_graph_state(self, capture_bs: List[int]) -> None:
        for bs in capture_bs:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self.kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
                backend="trtllm-gen",
            )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
        self.graph_wrappers[bs].plan(
            torch.arange(bs + 1, dtype=torch.int32),
            self.kv_indices[:bs],
            torch.ones(bs, dtype=torch.int32),
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )
        if self.has_window_layers:
            self._swa.plan(
                torch.arange(bs + 1, dtype=torch.int32),
                self.kv_indices[:bs],
                torch.ones(bs, dtype=torch.int32),
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                window_left=self.sliding_window,
                q_data_type=torch.bfloat16,
            )

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor, seq_lens_cpu: torch.Tensor
    ) -> None:
        total = self._stage_padded(bs, raw_bs, req_pool_indices, seq_lens_cpu)
        self._plan_decode(self.graph_wrappers[bs], bs, total)
        if self.has_window_layers:
            self._plan_decode(self._swa, bs, total, window_left=self.sliding_window)

    # -- forward ------------------------------------------------------------------------------

    def forward_decode(self, q: torch.Tensor, layer: Any, fb: ForwardBatch) -> torch.Tensor:
        kv = self.kv_pool.get_kv_buffer(layer.layer_id)
        if layer.sliding_window > 0:
            return self._swa.run(q, kv)  # expect: FC108
        wrapper = self.graph_wrappers.get(fb.batch_size, self._eager)
        return wrapper.run(q, kv)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, fb: ForwardBatch) -> torch.Tensor:
        bs = fb.batch_size
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=self.kv_pool.get_kv_buffer(layer.layer_id),
            workspace_buffer=self.context_workspace,
            block_tables=self.block_tables[:bs],
            seq_lens=fb.seq_lens,
            max_q_len=fb.max_extend_len,
            max_kv_len=fb.seq_lens_max,
            bmm1_scale=layer.scaling,
            bmm2_scale=1.0,
            batch_size=bs,
            cum_seq_lens_q=fb.qo_indptr,
            cum_seq_lens_kv=self.cu_kv_lens[: bs + 1],
        )
