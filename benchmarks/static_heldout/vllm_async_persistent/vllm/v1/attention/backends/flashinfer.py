"""FlashInfer attention: metadata built from the persistent batch's host mirrors, decode rows first."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from vllm.v1.worker.gpu_input_batch import CpuGpuBuffer

FLASHINFER_WORKSPACE_BUFFER_SIZE = 256 * 1024 * 1024


@dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor  # device
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_table_np: np.ndarray
    slot_mapping: torch.Tensor
    num_reqs: int
    max_query_len: int
    num_actual_tokens: int = field(init=False)

    def __post_init__(self):
        self.num_actual_tokens = int(self.query_start_loc_cpu[self.num_reqs])


@dataclass
class FlashInferMetadata:
    num_decodes: int
    num_decode_tokens: int
    slot_mapping: torch.Tensor
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    spec_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None


class FlashInferMetadataBuilder:
    def __init__(self, cfg, device: torch.device):
        self.device, self.page_size, self.max_blocks = device, cfg.block_size, cfg.max_blocks_per_req
        self.heads, self.num_spec = (cfg.num_heads, cfg.num_kv_heads, cfg.head_size), cfg.num_speculative_tokens
        self._kv_layout = "NHD"
        max_reqs, head_bytes = cfg.max_num_reqs, cfg.num_heads * (cfg.head_size + 1) * 4
        self._workspace_buffer = torch.zeros(FLASHINFER_WORKSPACE_BUFFER_SIZE, dtype=torch.uint8, device=device)  # expect: FC106
        self._prefill_workspace = torch.zeros(cfg.max_num_batched_tokens * head_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self._spec_workspace = torch.empty(max_reqs * (1 + self.num_spec) * head_bytes * 8, dtype=torch.uint8, device=device)  # ok: FC105
        self.paged_kv_indptr = CpuGpuBuffer(max_reqs + 1, dtype=torch.int32, device=device)
        self.paged_kv_indices = CpuGpuBuffer(max_reqs * self.max_blocks, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = CpuGpuBuffer(max_reqs, dtype=torch.int32, device=device)
        q = 1 + self.num_spec  # uniform verify: every decode row carries its draft tokens
        self._spec_qo_indptr = torch.arange(0, (max_reqs + 1) * q, q, dtype=torch.int32).pin_memory()
        self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self._workspace_buffer, self._kv_layout)  # ok: FC103
        self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._prefill_workspace, self._kv_layout)
        self._spec_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._spec_workspace, self._kv_layout)
        self._graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._last_prefill_key: Optional[tuple] = None

    def _get_decode_wrapper(self, batch_size: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = self._graph_decode_wrappers.get(batch_size)
        if w is None:
            self.paged_kv_last_page_len.gpu[:batch_size].fill_(1)  # ok: FC104
            w = BatchDecodeWithPagedKVCacheWrapper(
                self._workspace_buffer, self._kv_layout, use_cuda_graph=True,  # ok: FC103
                paged_kv_indptr_buffer=self.paged_kv_indptr.gpu[: batch_size + 1],
                paged_kv_indices_buffer=self.paged_kv_indices.gpu,
                paged_kv_last_page_len_buffer=self.paged_kv_last_page_len.gpu[:batch_size])
            self._graph_decode_wrappers[batch_size] = w
        return w

    def build(self, common: CommonAttentionMetadata, use_cudagraph: bool = False) -> FlashInferMetadata:
        n, qsl_cpu = common.num_reqs, common.query_start_loc_cpu
        query_lens_cpu = qsl_cpu[1 : n + 1] - qsl_cpu[:n]
        num_decodes = int((query_lens_cpu <= 1 + self.num_spec).sum())  # ok: FC101
        num_decode_tokens = int(common.query_start_loc[num_decodes])  # expect: FC101
        seq_lens = common.seq_lens_cpu[:n].numpy()
        blocks = (seq_lens + self.page_size - 1) // self.page_size
        self.paged_kv_indptr.np[0] = 0
        np.cumsum(blocks, out=self.paged_kv_indptr.np[1 : n + 1])
        nnz = int(self.paged_kv_indptr.np[n])
        self.paged_kv_indices.np[:nnz] = common.block_table_np[:n][np.arange(self.max_blocks) < blocks[:, None]]
        self.paged_kv_last_page_len.np[:n] = seq_lens - (blocks - 1) * self.page_size
        self.paged_kv_indptr.copy_to_gpu(n + 1)
        self.paged_kv_indices.copy_to_gpu(nnz)  # ok: FC104
        self.paged_kv_last_page_len.copy_to_gpu(n)
        md, nd = FlashInferMetadata(num_decodes, num_decode_tokens, common.slot_mapping), num_decodes
        if nd and self.num_spec:
            self._spec_wrapper.plan(self._spec_qo_indptr[: nd + 1], self.paged_kv_indptr.cpu[: nd + 1],  # ok: FC102
                                    self.paged_kv_indices.gpu, self.paged_kv_last_page_len.cpu[:nd], *self.heads,
                                    self.page_size, causal=True)
            md.spec_wrapper = self._spec_wrapper
        elif nd and use_cudagraph:
            w = self._get_decode_wrapper(nd)
            w.plan(self.paged_kv_indptr.cpu[: nd + 1], self.paged_kv_indices.gpu,  # expect: FC102
                   self.paged_kv_last_page_len.gpu[:nd], *self.heads, self.page_size)
            md.decode_wrapper = w
        elif nd:
            self._decode_wrapper.plan(self.paged_kv_indptr.cpu[: nd + 1], self.paged_kv_indices.gpu,  # ok: FC102
                                      self.paged_kv_last_page_len.cpu[:nd], *self.heads, self.page_size)
            md.decode_wrapper = self._decode_wrapper
        if nd < n:
            start = int(self.paged_kv_indptr.np[nd])
            key = (n - nd, nnz - start)
            if key != self._last_prefill_key or getattr(self._prefill_wrapper, "_plan_info", None) is None:  # expect: FC103
                qo_indptr = common.query_start_loc[nd : n + 1] - num_decode_tokens
                self._prefill_wrapper.plan(qo_indptr, self.paged_kv_indptr.cpu[nd : n + 1] - start,  # expect: FC102
                                           self.paged_kv_indices.gpu[start:], self.paged_kv_last_page_len.cpu[nd:n],
                                           *self.heads, self.page_size, causal=True)
                self._last_prefill_key = key
            md.prefill_wrapper = self._prefill_wrapper
        return md


class FlashInferImpl:
    def __init__(self, num_heads: int, head_size: int):
        self.num_heads, self.head_size = num_heads, head_size

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, md: FlashInferMetadata) -> torch.Tensor:
        q = q.view(-1, self.num_heads, self.head_size)
        if md.spec_wrapper is not None:
            return md.spec_wrapper.run(q, kv_cache)  # expect: FC108
        return md.decode_wrapper.run(q, kv_cache)  # ok: FC108

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, md: FlashInferMetadata) -> torch.Tensor:
        nd = md.num_decode_tokens
        out = torch.empty_like(q).view(-1, self.num_heads, self.head_size)
        if md.num_decodes:
            out[:nd] = self.forward_decode(q[:nd], kv_cache, md)
        if md.prefill_wrapper is not None:
            out[nd:] = md.prefill_wrapper.run(q[nd:].view(-1, self.num_heads, self.head_size), kv_cache)
        return out
