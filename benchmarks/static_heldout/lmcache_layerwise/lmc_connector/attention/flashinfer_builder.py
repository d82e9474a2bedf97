"""FlashInfer metadata for one step: decode rows first, then prefill rows (vLLM v1 ordering)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from lmc_connector.config import EngineLimits

_WORKSPACE_BYTES = int(os.environ.get("LMC_FLASHINFER_WORKSPACE_BYTES", 394 * 1024 * 1024))
_global_workspace: Optional[torch.Tensor] = None


def _get_workspace_buffer(device: torch.device) -> torch.Tensor:
    global _global_workspace
    if _global_workspace is None:
        _global_workspace = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
    return _global_workspace


@dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_table_np: np.ndarray
    slot_mapping: torch.Tensor
    num_reqs: int
    num_actual_tokens: int


@dataclass
class FlashInferMetadata:
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    slot_mapping: torch.Tensor
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None


class FlashInferMetadataBuilder:
    def __init__(self, limits: EngineLimits, device: torch.device) -> None:
        self.limits = limits
        self.device = device
        self.page_size = limits.block_size
        self._kv_layout = "NHD"  # ok: FC103
        self.prefill_workspace = torch.empty(limits.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout, backend="fa2")
        self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(_get_workspace_buffer(device), self._kv_layout)
        self._graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        max_reqs = limits.max_num_seqs
        self.paged_kv_indptr = torch.zeros(max_reqs + 1, dtype=torch.int32, device=device)
        self.paged_kv_indices = torch.zeros(limits.num_blocks, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = torch.zeros(max_reqs, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len.fill_(1)  # ok: FC104
        self.paged_kv_indptr_cpu = torch.zeros(max_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_last_page_len_cpu = torch.ones(max_reqs, dtype=torch.int32, pin_memory=True)
        self.paged_kv_indices_cpu = torch.zeros(limits.num_blocks, dtype=torch.int32, pin_memory=True)
        self._last_plan_key: Optional[Tuple[int, int, int]] = None

    def _get_decode_wrapper(self, batch_size: int, use_cudagraph: bool) -> BatchDecodeWithPagedKVCacheWrapper:
        if not use_cudagraph:
            return self._decode_wrapper
        w = self._graph_decode_wrappers.get(batch_size)
        if w is None:
            w = BatchDecodeWithPagedKVCacheWrapper(
                _get_workspace_buffer(self.device),
                self._kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.paged_kv_indptr[: batch_size + 1],
                paged_kv_indices_buffer=self.paged_kv_indices,
                paged_kv_last_page_len_buffer=self.paged_kv_last_page_len[:batch_size],
            )
            self._graph_decode_wrappers[batch_size] = w
        return w

    def build(self, common: CommonAttentionMetadata, use_cudagraph: bool = False, padded_decodes: int = 0) -> FlashInferMetadata:
        lim = self.limits
        num_reqs = common.num_reqs
        qsl_cpu = common.query_start_loc_cpu
        query_lens_cpu = qsl_cpu[1 : num_reqs + 1] - qsl_cpu[:num_reqs]
        num_decodes = int((query_lens_cpu == 1).sum())  # ok: FC101
        num_prefills = num_reqs - num_decodes
        num_decode_tokens = num_decodes

        seq_lens_np = common.seq_lens_cpu[:num_reqs].numpy()
        pages_np = (seq_lens_np + self.page_size - 1) // self.page_size
        indptr_np = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(pages_np, out=indptr_np[1:])
        nnz = int(indptr_np[-1])
        mask = np.arange(common.block_table_np.shape[1])[None, :] < pages_np[:, None]
        self.paged_kv_indices_cpu[:nnz] = torch.from_numpy(common.block_table_np[:num_reqs][mask])
        self.paged_kv_indptr_cpu[: num_reqs + 1] = torch.from_numpy(indptr_np)
        self.paged_kv_last_page_len_cpu[:num_reqs] = torch.from_numpy((seq_lens_np - 1) % self.page_size + 1)
        self.paged_kv_indices[:nnz].copy_(self.paged_kv_indices_cpu[:nnz], non_blocking=True)  # ok: FC104

        meta = FlashInferMetadata(
            num_actual_tokens=common.num_actual_tokens,
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            num_prefills=num_prefills,
            slot_mapping=common.slot_mapping,
        )
        if num_decodes > 0:
            n = max(padded_decodes, num_decodes) if use_cudagraph else num_decodes
            self.paged_kv_indptr_cpu[num_decodes + 1 : n + 1] = int(indptr_np[num_decodes])
            self.paged_kv_last_page_len_cpu[num_decodes:n] = 1
            w = self._get_decode_wrapper(n, use_cudagraph)
            key = (n, nnz, hash(seq_lens_np[:num_decodes].tobytes()))
            if key != self._last_plan_key or w._plan_info is None:  # expect: FC103
                w.plan(  # ok: FC102
                    self.paged_kv_indptr_cpu[: n + 1],
                    self.paged_kv_indices,
                    self.paged_kv_last_page_len_cpu[:n],
                    lim.num_qo_heads,
                    lim.num_kv_heads,
                    lim.head_dim,
                    self.page_size,
                    q_data_type=torch.bfloat16,
                )
                self._last_plan_key = key
            meta.decode_wrapper = w
        if num_prefills > 0:
            max_prefill_q = int(common.query_start_loc[num_decodes:].diff().max())  # expect: FC101
            first = int(indptr_np[num_decodes])
            qo_indptr = common.query_start_loc[num_decodes : num_reqs + 1] - num_decode_tokens
            self._prefill_wrapper.plan(  # expect: FC102
                qo_indptr,
                self.paged_kv_indptr_cpu[num_decodes : num_reqs + 1] - first,
                self.paged_kv_indices[first:nnz],
                self.paged_kv_last_page_len_cpu[num_decodes:num_reqs],
                lim.num_qo_heads,
                lim.num_kv_heads,
                lim.head_dim,
                self.page_size,
                causal=True,
                q_data_type=torch.bfloat16,
                max_token_per_sequence=max_prefill_q,
            )
            meta.prefill_wrapper = self._prefill_wrapper
        return meta

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        return self.build(common, use_cudagraph=True, padded_decodes=common.num_reqs)
