"""Per-model FlashInfer backend. One instance per resident model, never shared."""

from __future__ import annotations

import logging
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from mmserve.batch import StepBatch
from mmserve.registry import ModelSpec

logger = logging.getLogger(__name__)

# ragged prefill of every hosted model shares one scratch area
_SHARED_PREFILL_WS_BYTES = 256 * 1024 * 1024


class PerModelAttnBackend:
    def __init__(self, spec: ModelSpec, max_bs: int, max_tokens: int, device: torch.device):
        self.spec = spec
        self.device = device
        self.max_bs = max_bs
        self.graph_bs: Optional[int] = None

        ws_bytes = spec.workspace_bytes_for(max_tokens)
        self.workspace_buffer = torch.zeros(ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_workspace = torch.empty(_SHARED_PREFILL_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106

        self.decode_backend = "trtllm-gen" if spec.use_trtllm_decode else "fa2"
        self.graph_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.graph_workspace.zero_()
        self.trtllm_workspace: Optional[torch.Tensor] = None
        if spec.use_trtllm_decode:
            self.trtllm_workspace = torch.empty(  # expect: FC105
                max_bs * spec.num_qo_heads * 4096, dtype=torch.uint8, device=device
            )

        max_pages = max_bs * spec.max_pages_per_req
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_np = self.kv_indptr_cpu.numpy()
        self.kv_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.block_tables = torch.zeros(max_bs, spec.max_pages_per_req, dtype=torch.int32, device=device)
        self.seq_lens_gpu = torch.zeros(max_bs, dtype=torch.int32, device=device)

        # shared system-prompt pages, attended as one extra "request" and merged (cascade)
        self.prefix_page_ids = torch.zeros(max(1, spec.shared_prefix_tokens // spec.page_size + 1),
                                           dtype=torch.int32, device=device)
        n_prefix_pages = self.prefix_page_ids.numel()
        self.prefix_kv_indptr = torch.tensor([0, n_prefix_pages], dtype=torch.int32, device=device)
        self.prefix_last_len = torch.tensor([spec.shared_prefix_tokens % spec.page_size or spec.page_size],
                                            dtype=torch.int32)
        self._prefix_qo_cpu = torch.zeros(2, dtype=torch.int32, pin_memory=True)

        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace_buffer, "NHD", use_tensor_cores=spec.gqa_ratio >= 4
        )
        self.ragged_prefill = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.prefix_prefill = BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, "NHD")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    # ---- graph set-up -------------------------------------------------------------
    def init_cuda_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.spec.gqa_ratio >= 4,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            backend=self.decode_backend,
        )
        self.graph_wrappers[bs] = w
        return w

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.graph_bs = bs
        self.kv_indptr_np[: bs + 1] = np.arange(bs + 1, dtype=np.int32)
        self.graph_wrappers[bs].plan(
            self.kv_indptr_cpu[: bs + 1], self.kv_indices[:bs], self.last_page_len_cpu[:bs],
            self.spec.num_qo_heads, self.spec.num_kv_heads, self.spec.head_dim, self.spec.page_size,
            q_data_type=torch.bfloat16,
        )

    # ---- per step -----------------------------------------------------------------
    def init_forward_metadata(self, batch: StepBatch) -> None:
        self.graph_bs = None
        bs = len(batch.req_ids)
        if batch.is_decode:
            self._plan_eager_decode(batch, bs)
        else:
            self._plan_extend(batch, bs)
        if self.spec.has_shared_prefix:
            self._plan_shared_prefix(batch)

    def _plan_eager_decode(self, batch: StepBatch, bs: int) -> None:
        max_pages = int(batch.num_pages.max())  # expect: FC101
        self.ensure_page_capacity(bs * max_pages)
        torch.cumsum(batch.num_pages, 0, out=self.kv_indptr[1 : bs + 1])
        self.eager_decode.plan(self.kv_indptr[: bs + 1], batch.page_ids, batch.last_page_len_cpu[:bs],  # expect: FC102
                               self.spec.num_qo_heads, self.spec.num_kv_heads, self.spec.head_dim,
                               self.spec.page_size, q_data_type=torch.bfloat16)
        if self.spec.use_trtllm_decode:
            self.seq_lens_gpu[:bs].copy_(batch.seq_lens, non_blocking=True)

    def _plan_extend(self, batch: StepBatch, bs: int) -> None:
        n_tok = int(batch.seq_lens_cpu[:bs].sum())  # ok: FC101
        logger.debug("extend %s: %d tokens over %d requests", batch.model_id, n_tok, bs)
        self.ragged_prefill.plan(batch.qo_indptr_cpu, batch.qo_indptr_cpu,  # ok: FC102
                                 self.spec.num_qo_heads, self.spec.num_kv_heads, self.spec.head_dim,
                                 causal=True, q_data_type=torch.bfloat16)

    def _plan_shared_prefix(self, batch: StepBatch) -> None:
        self._prefix_qo_cpu[1] = batch.num_tokens
        self.prefix_prefill.plan(self._prefix_qo_cpu, self.prefix_kv_indptr, self.prefix_page_ids,  # expect: FC102
                                 self.prefix_last_len, self.spec.num_qo_heads, self.spec.num_kv_heads,
                                 self.spec.head_dim, self.spec.page_size, causal=False)

    def ensure_page_capacity(self, n_pages: int) -> None:
        if n_pages > self.kv_indices.numel():
            logger.warning("growing page index buffers of %s to %d", self.spec.model_id, n_pages)
            self.kv_indices = torch.zeros(n_pages, dtype=torch.int32, device=self.device)  # expect: FC107
            self.kv_indices_cpu = torch.zeros(n_pages, dtype=torch.int32, pin_memory=True)  # ok: FC107

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> None:
        self.graph_bs = bs
        self._check_context(batch, bs)
        if self.spec.has_shared_prefix:
            self._plan_shared_prefix(batch)
        w = self.graph_wrappers[bs]
        self.kv_indptr_np[0] = 0
        np.cumsum(batch.num_pages_cpu[:bs], out=self.kv_indptr_np[1 : bs + 1])
        total = int(self.kv_indptr_np[bs])  # ok: FC101
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:total].copy_(batch.page_ids[:total], non_blocking=True)  # ok: FC104
        self.last_page_len_cpu[:bs].copy_(batch.last_page_len_cpu[:bs])
        w.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices[:total], self.last_page_len_cpu[:bs],  # ok: FC102
               self.spec.num_qo_heads, self.spec.num_kv_heads, self.spec.head_dim, self.spec.page_size,
               q_data_type=torch.bfloat16)
        self.kv_last_page_len[:bs].copy_(self.last_page_len_cpu[:bs], non_blocking=True)  # expect: FC104

    def _check_context(self, batch: StepBatch, bs: int) -> None:
        if (batch.seq_lens[:bs] > self.spec.max_context).any():  # expect: FC101
            raise ValueError(f"{self.spec.model_id}: a request exceeds max_context={self.spec.max_context}")

    # ---- forward ------------------------------------------------------------------
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int, bs: int) -> torch.Tensor:
        if self.trtllm_workspace is not None and self.graph_bs is None:
            return trtllm_batch_decode_with_kv_cache(
                q, kv_cache, self.trtllm_workspace, self.block_tables[:bs], self.seq_lens_gpu[:bs],
                self.spec.max_context,
            )
        w = self.graph_wrappers[bs] if self.graph_bs is not None else self.eager_decode
        out, lse = w.run(q, kv_cache, return_lse=True)  # ok: FC108
        if self.spec.has_shared_prefix:
            p_out, p_lse = self.prefix_prefill.run(q, kv_cache, return_lse=True)  # expect: FC108
            out, _ = merge_state(out, lse, p_out, p_lse)
        return out

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged_prefill.run(q, k, v)
