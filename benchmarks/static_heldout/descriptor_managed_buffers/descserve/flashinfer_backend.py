"""SGLang-style FlashInfer attention backend (FA2 kernels)."""

from __future__ import annotations

import logging
from typing import Any, List, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)

from descserve_kernels.paged_ops import PagedKVPool, build_kv_indices

from .attn_base import AttnBackendBase
from .config import RAGGED_WORKSPACE_BYTES, EngineConfig
from .descriptors import FixedWorkspace, LazyWrapper, WrapperAttr
from .forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


class FlashInferAttnBackend(AttnBackendBase):
    """Paged decode and prefill through FlashInfer wrappers.

    ``decode_wrapper`` is the wrapper the next decode forward runs: the eager one after
    ``init_forward_metadata``, the captured bucket's graph wrapper after the capture and
    replay metadata functions.
    """

    CASCADE_WORKSPACE_BYTES = 128 * 1024 * 1024

    ragged_workspace = FixedWorkspace(RAGGED_WORKSPACE_BYTES)
    # Sliding-window layers: built on first use, so that models without windows never pay for it.
    window_wrapper = LazyWrapper(
        lambda o: BatchDecodeWithPagedKVCacheWrapper(o.window_workspace, o.kv_layout, backend="fa2")
    )
    # Whether the active decode kernels were JIT-compiled (warm-up check).
    decode_module = WrapperAttr("_active_decode", "_cached_module")

    def __init__(self, cfg: EngineConfig, kv_pool: PagedKVPool, req_to_page: torch.Tensor, device: torch.device) -> None:
        super().__init__(cfg, kv_pool, req_to_page, device)
        self._eager_decode = BatchDecodeWithPagedKVCacheWrapper(
            self.float_workspace, self.kv_layout, use_tensor_cores=self._use_tensor_cores()
        )
        self._active_decode = self._eager_decode
        self.prefill_wrapper_paged = BatchPrefillWithPagedKVCacheWrapper(self.float_workspace, self.kv_layout)
        self.prefill_wrapper_ragged = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, self.kv_layout)
        self._window_ws: Optional[torch.Tensor] = None
        self._cascade: Optional[MultiLevelCascadeAttentionWrapper] = None
        self._cascade_ws: Optional[torch.Tensor] = None
        self._use_ragged = False

    # -- wrappers and workspaces as properties --------------------------------------------

    @property
    def decode_wrapper(self) -> BatchDecodeWithPagedKVCacheWrapper:
        return self._active_decode

    @decode_wrapper.setter
    def decode_wrapper(self, wrapper: BatchDecodeWithPagedKVCacheWrapper) -> None:
        assert isinstance(wrapper, BatchDecodeWithPagedKVCacheWrapper), type(wrapper)  # expect: FC109
        previous, self._active_decode = self._active_decode, wrapper
        bs = self._active_bs
        if wrapper is not previous and bs:
            # A wrapper swapped in after the metadata was built has not seen this batch:
            # plan it with the page table the backend already holds.
            wrapper.plan(  # expect: FC102
                self.kv_indptr[: bs + 1],
                self.kv_indices,
                self.kv_last_page_len[:bs],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                q_data_type=torch.bfloat16,
            )

    @property
    def decode_plan_info(self) -> Any:
        """The active decode plan, logged after warm-up."""
        return self._active_decode._plan_info  # expect: FC103

    @property
    def window_workspace(self) -> torch.Tensor:
        if self._window_ws is None:
            # split-k partials of one decode step at the token limit, plus the plan's scratch
            self._window_ws = torch.empty(self.max_num_tokens * self.num_qo_heads * self.head_dim * 4 + (32 << 20), dtype=torch.uint8, device=self.device)  # ok: FC106
        return self._window_ws

    @property
    def cascade_workspace(self) -> torch.Tensor:
        if self._cascade_ws is None:
            self._cascade_ws = torch.zeros(self.CASCADE_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        return self._cascade_ws

    @property
    def cascade_wrapper(self) -> MultiLevelCascadeAttentionWrapper:
        if self._cascade is None:
            self._cascade = MultiLevelCascadeAttentionWrapper(2, self.cascade_workspace, self.kv_layout)
        return self._cascade

    def all_wrappers(self) -> List[Any]:
        return [self._eager_decode, self.prefill_wrapper_paged, self.prefill_wrapper_ragged, *self.graph_wrappers.values()]

    # -- per-step metadata ----------------------------------------------------------------

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        total = self._stage_page_table(bs, fb.seq_lens_cpu, fb.req_pool_indices)
        if fb.forward_mode.is_decode():
            self._eager_decode.plan(  # ok: FC102
                self.kv_indptr_cpu[: bs + 1],
                self.kv_indices[:total],
                self.last_page_len_cpu[:bs],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                q_data_type=torch.bfloat16,
            )
            if self.has_window_layers:
                self.window_wrapper.plan(
                    self.kv_indptr_cpu[: bs + 1],
                    self.kv_indices[:total],
                    self.last_page_len_cpu[:bs],
                    self.num_qo_heads,
                    self.num_kv_heads,
                    self.head_dim,
                    self.page_size,
                    window_left=self.sliding_window,
                    q_data_type=torch.bfloat16,
                )
            if fb.use_cascade:
                self._plan_cascade(fb)
            self._active_bs = bs
            # After a graph replay the bucket's graph wrapper is still the active one.
            self.decode_wrapper = self._eager_decode
            return

        # Ragged when no request has cached pages: every key of the batch is in this step.
        self._use_ragged = fb.seq_lens_sum == fb.extend_num_tokens
        if self._use_ragged:
            self.prefill_wrapper_ragged.plan(  # ok: FC102
                fb.qo_indptr_cpu,
                fb.qo_indptr_cpu,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                causal=True,
                q_data_type=torch.bfloat16,
            )
        else:
            self.prefill_wrapper_paged.plan(  # expect: FC102
                fb.qo_indptr,
                self.kv_indptr_cpu[: bs + 1],
                self.kv_indices[:total],
                self.last_page_len_cpu[:bs],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                causal=True,
                q_data_type=torch.bfloat16,
            )

    def _plan_cascade(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        shared = fb.shared_prefix_pages
        self.cascade_wrapper.plan(
            [torch.tensor([0, bs], dtype=torch.int32), torch.arange(bs + 1, dtype=torch.int32)],
            [torch.tensor([0, shared], dtype=torch.int32), fb.suffix_kv_indptr_cpu],
            [fb.prefix_kv_indices, fb.suffix_kv_indices],
            [torch.tensor([self.page_size], dtype=torch.int32), self.last_page_len_cpu[:bs]],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )

    # -- CUDA graphs --------------------------------------------------------------------------

    def init_cuda_graph_state(self, capture_bs: List[int]) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104
        # graph decode never sees more rows than the largest captured batch
        self.graph_float_workspace = torch.zeros(max(capture_bs) * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (8 << 20), dtype=torch.uint8, device=self.device)  # ok: FC106
        for bs in capture_bs:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_float_workspace,
                self.kv_layout,
                use_cuda_graph=True,
                use_tensor_cores=self._use_tensor_cores(),
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
        wrapper = self.graph_wrappers[bs]
        # one page per dummy request
        indptr_host = torch.arange(bs + 1, dtype=torch.int32)
        last_page_len_host = torch.ones(bs, dtype=torch.int32)
        wrapper.plan(
            indptr_host,
            self.kv_indices[:bs],
            last_page_len_host,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )
        if self.has_window_layers:
            self.window_wrapper.plan(
                indptr_host,
                self.kv_indices[:bs],
                last_page_len_host,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                window_left=self.sliding_window,
                q_data_type=torch.bfloat16,
            )
        self._active_bs = 0  # nothing for the setter to re-plan
        self.decode_wrapper = wrapper

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor, seq_lens_cpu: torch.Tensor
    ) -> None:
        wrapper = self.graph_wrappers[bs]
        total = self._fill_page_mirrors(raw_bs, seq_lens_cpu)
        self.kv_indptr_np[raw_bs + 1 : bs + 1] = total
        self.last_page_len_np[raw_bs:bs] = 1
        if total > self.kv_indices.numel():  # ok: FC101
            # a long request outgrew the index buffer; the descriptor rebinds the slot
            self.kv_indices = torch.empty(total, dtype=torch.int32, device=self.device)  # expect: FC107
        logger.debug("replay bs=%d raw_bs=%d kv_indptr=%s", bs, raw_bs, self.kv_indptr[: bs + 1])  # ok: FC101
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        build_kv_indices(self.req_to_page, req_pool_indices[:raw_bs], self.kv_indptr, self.kv_indices, total)  # ok: FC104
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices[:total],
            self.last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )
        # padded rows carry no pages: give them an empty last page as well
        self.kv_last_page_len[raw_bs:bs].zero_()  # expect: FC104
        # the wrapper was planned just above: bypass the re-planning setter
        self._active_decode = wrapper
        self._active_bs = bs

    # -- forward ------------------------------------------------------------------------------

    def forward_decode(self, q: torch.Tensor, layer: Any, fb: ForwardBatch) -> torch.Tensor:
        kv = self.kv_pool.get_kv_buffer(layer.layer_id)
        if layer.sliding_window > 0:
            return self.window_wrapper.run(q, kv)  # expect: FC108
        if fb.use_cascade:
            return self.cascade_wrapper.run(q, kv)  # ok: FC108
        return self.decode_wrapper.run(q, kv)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, fb: ForwardBatch) -> torch.Tensor:
        if self._use_ragged:
            return self.prefill_wrapper_ragged.run(q, k, v)  # ok: FC108
        return self.prefill_wrapper_paged.run(q, self.kv_pool.get_kv_buffer(layer.layer_id))  # ok: FC108
