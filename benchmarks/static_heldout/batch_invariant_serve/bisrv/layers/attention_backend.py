"""FlashInfer attention with a fixed KV split, SGLang's backend interface.

``fixed_split_size`` makes the split-kv decode and prefill kernels cut every request's KV at the same token
boundaries whatever the batch looks like, so the partial sums are merged in the same order in every batch.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional

import numpy as np
import torch
import triton
import triton.language as tl
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from bisrv.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from bisrv.model_runner import ModelRunner

logger = logging.getLogger(__name__)

# Decode wrappers (eager and graph) share one workspace.
_DECODE_WS_BYTES = int(os.getenv("BISRV_DECODE_WS_BYTES", 192 * 1024 * 1024))


@functools.lru_cache(maxsize=None)
def get_trtllm_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device_index}")  # expect: FC105


@triton.jit
def create_kv_indices_kernel(
    req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr, kv_indptr_ptr, kv_indices_ptr, stride,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    req = tl.load(req_pool_indices_ptr + pid)
    start = tl.load(kv_indptr_ptr + pid)
    n = tl.load(seq_lens_ptr + pid)
    for off in range(0, n, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        mask = cols < n
        tok = tl.load(req_to_token_ptr + req * stride + cols, mask=mask)
        tl.store(kv_indices_ptr + start + cols, tok, mask=mask)


@dataclass
class DecodeMetadata:
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper


@dataclass
class ExtendMetadata:
    prefill_wrapper: BatchPrefillWithPagedKVCacheWrapper
    token_rows: torch.Tensor
    use_trtllm_context: bool = False


class FixedSplitFlashInferBackend:
    def __init__(self, model_runner: "ModelRunner"):
        det = model_runner.det
        self.det = det
        self.device = model_runner.device
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.kv_pool = model_runner.token_to_kv_pool
        self.sm_scale = 1.0 / math.sqrt(det.head_dim)
        self.q_dtype = model_runner.dtype
        max_bs = det.max_batch_size
        dev = self.device

        self.decode_workspace = torch.zeros(_DECODE_WS_BYTES, dtype=torch.uint8, device=dev)  # expect: FC106
        self.prefill_workspace = torch.empty(det.prefill_workspace_bytes, dtype=torch.uint8, device=dev)  # ok: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", use_tensor_cores=True)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        if det.use_trtllm_decode:
            self.trtllm_ws = get_trtllm_workspace(det.trtllm_workspace_bytes(), dev.index or 0)
        self.context_ws = self._alloc_context_workspace() if det.use_trtllm_decode else None
        # the sampler's kernel flavour decides whether logits stay fp32 between layers and sampling
        self.fp32_logits = model_runner.sampler._backend == "triton"  # ok: FC103

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.empty(det.max_total_tokens, dtype=torch.int32, device=self.device)
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.unit_qo_indptr_cpu = torch.arange(max_bs + 1, dtype=torch.int32).pin_memory()
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.split_signature: Dict[int, tuple] = {}
        self.forward_metadata: Optional[object] = None

    def _alloc_context_workspace(self) -> torch.Tensor:
        ws = torch.empty(self.det.context_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105
        ws.zero_()
        return ws

    # ------------------------------------------------------------------ host page tables
    def _fill_indptr(self, bs: int, seq_lens_np: np.ndarray) -> int:
        indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(seq_lens_np[:bs], out=indptr[1:])
        self.kv_indptr_cpu[: bs + 1].copy_(torch.from_numpy(indptr))
        return int(indptr[-1])

    def _plan_decode(self, bs: int, wrapper: BatchDecodeWithPagedKVCacheWrapper, kv_indices: torch.Tensor) -> None:
        det = self.det
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            kv_indices,
            self.kv_last_page_len_cpu[:bs],
            det.num_qo_heads,
            det.num_kv_heads,
            det.head_dim,
            det.page_size,
            q_data_type=self.q_dtype,
            sm_scale=self.sm_scale,
            fixed_split_size=det.kv_split_tokens,
        )

    # ------------------------------------------------------------------ eager steps
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        det = self.det
        bs = fb.batch_size
        max_chunks = math.ceil(fb.seq_lens.max() / det.kv_split_tokens)  # expect: FC101
        if max_chunks > det.max_kv_chunks:
            raise RuntimeError(f"{max_chunks} KV chunks exceed the workspace's {det.max_kv_chunks}")
        nnz = self._fill_indptr(bs, fb.seq_lens_np)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
        create_kv_indices_kernel[(bs,)](
            self.req_to_token, fb.req_pool_indices, fb.seq_lens, self.kv_indptr, self.kv_indices,
            self.req_to_token.stride(0), BLOCK=512,
        )
        if fb.forward_mode.is_decode():
            if det.unified_kernel:
                self.prefill_wrapper.plan(  # ok: FC102
                    self.unit_qo_indptr_cpu[: bs + 1],
                    self.kv_indptr_cpu[: bs + 1],
                    self.kv_indices[:nnz],
                    self.kv_last_page_len_cpu[:bs],
                    det.num_qo_heads,
                    det.num_kv_heads,
                    det.head_dim,
                    det.page_size,
                    causal=True,
                    q_data_type=self.q_dtype,
                    fixed_split_size=det.prefill_split_tokens,
                )
            else:
                self._plan_decode(bs, self.decode_wrapper, self.kv_indices[:nnz])
            self.forward_metadata = DecodeMetadata(self.decode_wrapper)
            return

        # extend: ragged rows of new tokens over the request's whole KV (prefix included)
        qo = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(fb.extend_lens_np, out=qo[1:])
        self.qo_indptr_cpu[: bs + 1].copy_(torch.from_numpy(qo))
        self.qo_indptr[: bs + 1].copy_(self.qo_indptr_cpu[: bs + 1], non_blocking=True)
        self.prefill_wrapper.plan(  # expect: FC102
            self.qo_indptr[: bs + 1],
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len_cpu[:bs],
            det.num_qo_heads,
            det.num_kv_heads,
            det.head_dim,
            det.page_size,
            causal=True,
            q_data_type=self.q_dtype,
            fixed_split_size=det.prefill_split_tokens,
        )
        # token -> row map for per-request sampling positions; output_size keeps it free of a sync
        rows = torch.arange(bs, device=self.device)
        token_rows = torch.repeat_interleave(rows, fb.extend_lens, output_size=fb.extend_num_tokens)  # ok: FC101
        self.forward_metadata = ExtendMetadata(
            self.prefill_wrapper, token_rows=token_rows, use_trtllm_context=det.use_trtllm_decode
        )

    # ------------------------------------------------------------------ CUDA graphs
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        dev = self.device
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * self.det.max_context_len, dtype=torch.int32, device=dev)
        self.cuda_graph_kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=dev)

    def _graph_wrapper_for(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_kv_last_page_len[:bs],
        )
        # token-granular pages: every last page holds exactly one token
        self.cuda_graph_kv_last_page_len[:bs].fill_(1)  # ok: FC104
        self.graph_wrappers[bs] = w
        return w

    def init_forward_metadata_capture_cuda_graph(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, seq_lens_np: np.ndarray
    ) -> None:
        w = self._graph_wrapper_for(bs)
        nnz = self._fill_indptr(bs, seq_lens_np)
        self.cuda_graph_kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
        create_kv_indices_kernel[(bs,)](
            self.req_to_token, req_pool_indices, seq_lens, self.cuda_graph_kv_indptr, self.cuda_graph_kv_indices,
            self.req_to_token.stride(0), BLOCK=512,
        )
        self._plan_decode(bs, w, self.cuda_graph_kv_indices[:nnz])
        # every bucket must split exactly like bucket 1, or graph and eager steps diverge
        self.split_signature[bs] = tuple(w._plan_info)  # expect: FC103
        self.forward_metadata = DecodeMetadata(w)

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, seq_lens_np: np.ndarray
    ) -> None:
        nnz = self._fill_indptr(bs, seq_lens_np)
        self.cuda_graph_kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        create_kv_indices_kernel[(bs,)](
            self.req_to_token, req_pool_indices, seq_lens, self.cuda_graph_kv_indptr, self.cuda_graph_kv_indices,
            self.req_to_token.stride(0), BLOCK=512,
        )
        w = self.graph_wrappers[bs]
        self._plan_decode(bs, w, self.cuda_graph_kv_indices[:nnz])
        # padded rows attend to the reserved dummy slot 0
        pad_start = int(self.kv_indptr_cpu[raw_bs])
        self.cuda_graph_kv_indices[pad_start:nnz].zero_()  # expect: FC104
        self.forward_metadata = DecodeMetadata(w)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    # ------------------------------------------------------------------ kernels
    def forward_decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        kv = self.kv_pool.get_kv_buffer(layer_id)
        q = q.view(-1, self.det.num_qo_heads, self.det.head_dim)
        if self.det.unified_kernel:
            return self.prefill_wrapper.run(q, kv)  # expect: FC108
        return self.forward_metadata.decode_wrapper.run(q, kv)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        kv = self.kv_pool.get_kv_buffer(layer_id)
        q = q.view(-1, self.det.num_qo_heads, self.det.head_dim)
        meta = self.forward_metadata
        if meta.use_trtllm_context:
            return trtllm_batch_context_with_kv_cache(
                q, kv, self.context_ws, self.req_to_token[fb.req_pool_indices], fb.seq_lens,
                int(fb.extend_lens_np.max()), self.det.max_context_len, self.sm_scale, 1.0, fb.batch_size,
                self.qo_indptr[: fb.batch_size + 1], self.kv_indptr[: fb.batch_size + 1],
            )
        return meta.prefill_wrapper.run(q, kv)

    def forward_decode_trtllm(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        kv = self.kv_pool.get_kv_buffer(layer_id)
        return trtllm_batch_decode_with_kv_cache(
            q.view(-1, self.det.num_qo_heads, self.det.head_dim), kv, self.trtllm_ws,
            self.req_to_token[fb.req_pool_indices], fb.seq_lens, self.det.max_context_len,
            self.sm_scale, 1.0,
        )
