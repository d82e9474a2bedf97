from __future__ import annotations

import bisect
import logging
from typing import Optional

import numpy as np
import torch
import triton
import triton.language as tl
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from rpp.attn.metadata import CommonAttentionMetadata, FlashInferMetadata
from rpp.config import EngineConfig

logger = logging.getLogger(__name__)

FLASHINFER_WORKSPACE_BUFFER_SIZE = 256 * 1024 * 1024


@triton.jit
def _copy_page_indices_kernel(page_indices, block_table, block_table_stride, cu_num_blocks,
                              BLOCK_SIZE: tl.constexpr):
    req_idx = tl.program_id(0)
    row_ptr = block_table + req_idx * block_table_stride
    start_idx = tl.load(cu_num_blocks + req_idx)
    end_idx = tl.load(cu_num_blocks + req_idx + 1)
    num_blocks = end_idx - start_idx
    offset = tl.arange(0, BLOCK_SIZE)
    for i in tl.range(0, num_blocks, BLOCK_SIZE):
        block_ids = tl.load(row_ptr + i + offset, mask=i + offset < num_blocks)
        tl.store(page_indices + start_idx + i + offset, block_ids, mask=i + offset < num_blocks)


class FlashInferMetadataBuilder:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        m = cfg.model
        self.device = device
        self.page_size = cfg.cache.block_size
        self.num_qo_heads = m.num_q_heads
        self.num_kv_heads = m.num_kv_heads
        self.head_dim = m.head_dim
        self.sm_scale = m.head_dim ** -0.5
        self.q_dtype = torch.bfloat16
        self.kv_dtype = torch.float8_e4m3fn if cfg.cache.kv_cache_dtype.startswith("fp8") else torch.bfloat16
        self.kv_fp8 = cfg.cache.kv_cache_dtype.startswith("fp8")
        self.use_trtllm_decode = cfg.use_trtllm_decode
        self._kv_layout = "NHD"
        self.capture_sizes = sorted(cfg.cudagraph_capture_sizes)
        self.max_capture_size = cfg.max_capture_size
        max_reqs = cfg.scheduler.max_num_seqs
        self.max_num_reqs = max_reqs

        self.workspace_buffer = torch.zeros(FLASHINFER_WORKSPACE_BUFFER_SIZE, dtype=torch.uint8, device=device)  # expect: FC106
        ragged_ws_bytes = cfg.scheduler.max_num_batched_tokens * m.num_q_heads * (m.head_dim + 1) * 4 * 2
        self.ragged_workspace = torch.zeros(ragged_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        # split-k partial outputs and LSEs of the tensor-core decode kernel, per request
        self._fp8_ws_bytes = max_reqs * m.num_q_heads * 32 * (m.head_dim + 1) * 4
        self._trtllm_ws_bytes = max_reqs * m.num_q_heads * 64 * (m.head_dim + 2) * 4
        self._trtllm_ws: Optional[torch.Tensor] = None

        # persistent page metadata; graph-mode decode wrappers bind views of these
        self.paged_kv_indptr = torch.zeros(max_reqs + 1, dtype=torch.int32, device=device)
        self.paged_kv_indptr_cpu = torch.zeros(max_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_indptr_np = self.paged_kv_indptr_cpu.numpy()
        self.paged_kv_indices = torch.zeros(cfg.cache.num_gpu_blocks, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = torch.zeros(max_reqs, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len_cpu = torch.zeros(max_reqs, dtype=torch.int32, pin_memory=True)
        self.paged_kv_last_page_len_np = self.paged_kv_last_page_len_cpu.numpy()

        self._prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
        self._ragged_wrapper: Optional[BatchPrefillWithRaggedKVCacheWrapper] = None
        self._decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self._fp8_decode: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self._graph_decode_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    # ---- wrappers -------------------------------------------------------------------
    def _get_prefill_wrapper(self) -> BatchPrefillWithPagedKVCacheWrapper:
        if self._prefill_wrapper is None:
            self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, "NHD", backend="fa2")
        return self._prefill_wrapper

    def _get_ragged_wrapper(self) -> BatchPrefillWithRaggedKVCacheWrapper:
        if self._ragged_wrapper is None:
            self._ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, "NHD", backend="fa2")
        return self._ragged_wrapper

    def _get_fp8_decode(self) -> BatchDecodeWithPagedKVCacheWrapper:
        if self._fp8_decode is None:
            ws = torch.empty(self._fp8_ws_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105
            self._fp8_decode = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        return self._fp8_decode

    def _get_trtllm_workspace(self) -> torch.Tensor:
        if self._trtllm_ws is None:
            self._trtllm_ws = torch.empty(self._trtllm_ws_bytes, dtype=torch.uint8, device=self.device)  # expect: FC105
        return self._trtllm_ws

    def _get_decode_wrapper(self, batch_size: int, use_cudagraph: bool) -> BatchDecodeWithPagedKVCacheWrapper:
        layout = self._kv_layout  # ok: FC103
        if use_cudagraph:
            w = self._graph_decode_wrappers.get(batch_size)
            if w is None:
                w = BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace_buffer,
                    layout,
                    use_cuda_graph=True,
                    paged_kv_indptr_buffer=self.paged_kv_indptr[: batch_size + 1],
                    paged_kv_indices_buffer=self.paged_kv_indices,
                    paged_kv_last_page_len_buffer=self.paged_kv_last_page_len[:batch_size],
                    use_tensor_cores=self.num_qo_heads // self.num_kv_heads >= 4,
                )
                self._graph_decode_wrappers[batch_size] = w
            return w
        if self._decode_wrapper is None:
            self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace_buffer, layout, use_tensor_cores=self.num_qo_heads // self.num_kv_heads >= 4)
        return self._decode_wrapper

    def _padded_decode_size(self, num_decodes: int) -> Optional[int]:
        i = bisect.bisect_left(self.capture_sizes, num_decodes)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    # ---- per step -------------------------------------------------------------------
    def build(self, common_prefix_len: int, common: CommonAttentionMetadata) -> FlashInferMetadata:
        num_reqs = common.num_reqs
        page = self.page_size
        qsl_np = common.query_start_loc_cpu.numpy()
        seq_lens_np = common.seq_lens_cpu.numpy()
        query_lens_np = np.diff(qsl_np[: num_reqs + 1])
        is_decode = query_lens_np == 1
        num_decodes = int(is_decode.sum())  # ok: FC101
        num_prefills = num_reqs - num_decodes
        num_prefill_tokens = int(qsl_np[num_reqs] - qsl_np[num_decodes])
        # the trtllm-gen kernel sizes its grid from the longest sequence
        max_seq_len = common.seq_lens.max().item()  # expect: FC101
        logger.debug("decode seq_lens %s", common.seq_lens[:num_decodes])  # ok: FC101

        # page bookkeeping on the host
        num_blocks_np = (seq_lens_np + page - 1) // page
        self.paged_kv_indptr_np[0] = 0
        np.cumsum(num_blocks_np, out=self.paged_kv_indptr_np[1: num_reqs + 1])
        total_pages = int(self.paged_kv_indptr_np[num_reqs])
        last = seq_lens_np % page
        self.paged_kv_last_page_len_np[:num_reqs] = np.where(last == 0, page, last)

        if total_pages > self.paged_kv_indices.numel():
            self.paged_kv_indices = torch.empty(2 * total_pages, dtype=torch.int32, device=self.device)  # expect: FC107

        self.paged_kv_indptr[: num_reqs + 1].copy_(self.paged_kv_indptr_cpu[: num_reqs + 1], non_blocking=True)  # ok: FC104
        self.paged_kv_last_page_len[:num_reqs].copy_(self.paged_kv_last_page_len_cpu[:num_reqs], non_blocking=True)  # ok: FC104
        _copy_page_indices_kernel[(num_reqs,)](self.paged_kv_indices, common.block_table_tensor,  # ok: FC104
                                               common.block_table_tensor.stride(0), self.paged_kv_indptr,
                                               BLOCK_SIZE=1024)

        prefill_wrapper = None
        use_ragged = False
        if num_prefills > 0:
            computed_np = common.num_computed_tokens_cpu.numpy()[num_decodes:num_reqs]
            use_ragged = bool(np.all(computed_np == 0)) and not self.kv_fp8
            if use_ragged:
                # fresh prompts only (no prefix hit, no earlier chunk): attend to the new K/V
                prefill_wrapper = self._get_ragged_wrapper()
                qo_indptr_cpu = common.query_start_loc_cpu[num_decodes:] - common.query_start_loc_cpu[num_decodes]
                prefill_wrapper.plan(  # ok: FC102
                    qo_indptr=qo_indptr_cpu,
                    kv_indptr=qo_indptr_cpu,
                    num_qo_heads=self.num_qo_heads,
                    num_kv_heads=self.num_kv_heads,
                    head_dim_qk=self.head_dim,
                    causal=True,
                    sm_scale=self.sm_scale,
                    q_data_type=self.q_dtype,
                )
            else:
                # prefix-cache hits and chunk continuations read earlier KV from the pages
                prefill_wrapper = self._get_prefill_wrapper()
                first_page = int(self.paged_kv_indptr_np[num_decodes])
                qo_indptr = common.query_start_loc[num_decodes:] - common.query_start_loc[num_decodes]
                prefill_wrapper.plan(  # expect: FC102
                    qo_indptr,
                    self.paged_kv_indptr_cpu[num_decodes: num_reqs + 1] - first_page,
                    self.paged_kv_indices[first_page:],
                    self.paged_kv_last_page_len_cpu[num_decodes:num_reqs],
                    self.num_qo_heads,
                    self.num_kv_heads,
                    self.head_dim,
                    page,
                    causal=True,
                    sm_scale=self.sm_scale,
                    q_data_type=self.q_dtype,
                    kv_data_type=self.kv_dtype,
                )

        decode_wrapper = None
        fp8_decode_wrapper = None
        trtllm_ws = None
        if num_decodes > 0:
            if self.use_trtllm_decode:
                trtllm_ws = self._get_trtllm_workspace()
            elif self.kv_fp8:
                fp8_decode_wrapper = self._get_fp8_decode()
                fp8_decode_wrapper.plan(  # expect: FC102
                    self.paged_kv_indptr_cpu[: num_decodes + 1],
                    self.paged_kv_indices,
                    self.paged_kv_last_page_len[:num_decodes],
                    self.num_qo_heads,
                    self.num_kv_heads,
                    self.head_dim,
                    page,
                    q_data_type=self.q_dtype,
                    kv_data_type=self.kv_dtype,
                )
            else:
                padded = self._padded_decode_size(num_decodes) if num_prefills == 0 else None
                use_graph = padded is not None
                bs = padded if use_graph else num_decodes
                if use_graph and bs > num_decodes:
                    # padded rows are empty sequences on the null block
                    self.paged_kv_indptr_np[num_decodes + 1: bs + 1] = self.paged_kv_indptr_np[num_decodes]
                decode_wrapper = self._get_decode_wrapper(bs, use_graph)
                decode_wrapper.plan(  # ok: FC102
                    self.paged_kv_indptr_cpu[: bs + 1],
                    self.paged_kv_indices,
                    self.paged_kv_last_page_len_cpu[:bs],
                    self.num_qo_heads,
                    self.num_kv_heads,
                    self.head_dim,
                    page,
                    q_data_type=self.q_dtype,
                    kv_data_type=self.kv_dtype,
                )
                if use_graph and bs > num_decodes:
                    # the captured kernels read the padded rows too: give them one token
                    self.paged_kv_last_page_len[num_decodes:bs].fill_(1)  # expect: FC104

        return FlashInferMetadata(
            num_actual_tokens=common.num_actual_tokens,
            num_decodes=num_decodes,
            num_decode_tokens=num_decodes,
            num_prefills=num_prefills,
            num_prefill_tokens=num_prefill_tokens,
            slot_mapping=common.slot_mapping,
            prefill_wrapper=prefill_wrapper,
            use_ragged_prefill=use_ragged,
            decode_wrapper=decode_wrapper,
            fp8_decode_wrapper=fp8_decode_wrapper,
            trtllm_workspace=trtllm_ws,
            block_table=common.block_table_tensor[:num_decodes],
            seq_lens=common.seq_lens[:num_decodes],
            max_seq_len=max_seq_len,
        )

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        """Capture runs pure decode batches of a captured size."""
        m = self.build(0, common)
        m.num_prefills = 0
        m.num_prefill_tokens = 0
        return m
