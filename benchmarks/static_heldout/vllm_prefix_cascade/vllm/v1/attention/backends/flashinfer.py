"""FlashInfer backend for the v1 engine: cascade attention when every running request shares a cached
prefix, full CUDA graphs for pure-decode batches, trtllm-gen decode on Blackwell."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Protocol, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, MultiLevelCascadeAttentionWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

FLASHINFER_WORKSPACE_BUFFER_SIZE = 394 * 1024 * 1024


@dataclass
class AttentionConfig:
    use_trtllm_decode: bool = False
    cascade_workspace_bytes: int = 256 * 1024 * 1024


@dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor
    max_seq_len: int = 0


@dataclass
class FlashInferMetadata:
    num_actual_tokens: int
    slot_mapping: torch.Tensor
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    use_cascade: bool
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
    cascade_wrapper: Optional[MultiLevelCascadeAttentionWrapper] = None
    trtllm_block_tables: Optional[torch.Tensor] = None
    trtllm_seq_lens: Optional[torch.Tensor] = None
    trtllm_workspace: Optional[torch.Tensor] = None
    max_seq_len: int = 0


class AttentionMetadataBuilder(Protocol):
    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata) -> FlashInferMetadata: ...

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> FlashInferMetadata: ...


def split_decodes_and_prefills(m: CommonAttentionMetadata, decode_threshold: int) -> Tuple[int, int, int, int]:
    """Decodes come first in the reordered batch: (num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens)."""
    query_lens = m.query_start_loc_cpu[1 : m.num_reqs + 1] - m.query_start_loc_cpu[: m.num_reqs]
    is_prefill = query_lens > decode_threshold
    if not is_prefill.any():  # ok: FC101
        return m.num_reqs, 0, m.num_actual_tokens, 0
    first_prefill = is_prefill.int().argmax(dim=-1).item()  # ok: FC101
    num_decode_tokens = int(m.query_start_loc_cpu[first_prefill])
    return first_prefill, m.num_reqs - first_prefill, num_decode_tokens, m.num_actual_tokens - num_decode_tokens


def fast_plan_decode(self, indptr_cpu, indices, last_page_len_cpu, num_qo_heads, num_kv_heads, head_dim, page_size, q_data_type, kv_data_type):
    """Plan a graph-mode decode wrapper from host mirrors: copy them into its buffers, plan on the host."""
    batch_size = len(last_page_len_cpu)
    bound = (self._paged_kv_indptr_buf, self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf)  # expect: FC103
    for buf, src in zip(bound, (indptr_cpu, indices, last_page_len_cpu)):
        buf[: len(src)].copy_(src, non_blocking=True)
    qo_indptr_host = torch.arange(batch_size + 1, dtype=torch.int32)
    kv_lens_host = (indptr_cpu[1:] - indptr_cpu[:-1] - 1) * page_size + last_page_len_cpu
    self._plan_info = self._cached_module.plan(  # expect: FC103
        self._float_workspace_buffer, self._int_workspace_buffer, self._pin_memory_int_workspace_buffer, qo_indptr_host,
        indptr_cpu, kv_lens_host, batch_size, batch_size, num_qo_heads, num_kv_heads, page_size, True, head_dim, head_dim, False,
    )


class FlashInferMetadataBuilder:
    reorder_batch_threshold: ClassVar[int] = 1

    def __init__(self, vllm_config, layer_spec, device: torch.device):
        self.device = device
        self.attn_config: AttentionConfig = vllm_config.attention_config
        sched = vllm_config.scheduler_config
        self.page_size = layer_spec.block_size
        self.num_qo_heads = layer_spec.num_qo_heads
        self.num_kv_heads = layer_spec.num_kv_heads
        self.head_dim = layer_spec.head_dim
        self.kv_cache_dtype = layer_spec.dtype
        self.q_data_type = vllm_config.model_config.dtype
        self.cudagraph_sizes = sorted(vllm_config.compilation_config.cudagraph_capture_sizes)
        self.enable_cuda_graph = vllm_config.compilation_config.full_cuda_graph
        max_num_reqs = sched.max_num_seqs
        self.max_blocks_per_req = -(vllm_config.model_config.max_model_len // -self.page_size)
        self._workspace_buffer: Optional[torch.Tensor] = None
        self._decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self._prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
        self._cascade_wrapper: Optional[MultiLevelCascadeAttentionWrapper] = None
        self._decode_wrappers_cudagraph: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

        # device buffers the graph-mode decode wrappers are bound to
        self.paged_kv_indptr = torch.zeros(max_num_reqs + 1, dtype=torch.int32, device=device)
        self.paged_kv_indices = torch.zeros(max_num_reqs * self.max_blocks_per_req, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len.fill_(self.page_size)  # ok: FC104
        self.block_arange = torch.arange(self.max_blocks_per_req, dtype=torch.int32, device=device)
        # pinned host mirrors, filled through numpy views
        self.paged_kv_indptr_cpu = torch.zeros(max_num_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_indptr_np = self.paged_kv_indptr_cpu.numpy()
        self.paged_kv_last_page_len_cpu = torch.zeros(max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.paged_kv_last_page_len_np = self.paged_kv_last_page_len_cpu.numpy()

        # trtllm-gen decode keeps split-k counters in its workspace
        trtllm_bytes = max_num_reqs * self.num_qo_heads * self.head_dim * 4 * 16
        trtllm_ws = torch.empty(trtllm_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        trtllm_ws.zero_()
        self.trtllm_workspace = trtllm_ws

    def _get_workspace_buffer(self) -> torch.Tensor:
        if self._workspace_buffer is None:
            self._workspace_buffer = torch.zeros(FLASHINFER_WORKSPACE_BUFFER_SIZE, dtype=torch.uint8, device=self.device)  # expect: FC106
        return self._workspace_buffer

    def _get_decode_wrapper(self, batch_size: int, use_cudagraph: bool) -> BatchDecodeWithPagedKVCacheWrapper:
        if use_cudagraph:
            wrapper = self._decode_wrappers_cudagraph.get(batch_size)
            if wrapper is None:
                wrapper = BatchDecodeWithPagedKVCacheWrapper(
                    self._get_workspace_buffer(), "NHD", use_cuda_graph=True,
                    paged_kv_indptr_buffer=self.paged_kv_indptr[: batch_size + 1],
                    paged_kv_indices_buffer=self.paged_kv_indices,
                    paged_kv_last_page_len_buffer=self.paged_kv_last_page_len[:batch_size],
                    use_tensor_cores=True,
                )
                self.paged_kv_last_page_len[:batch_size].fill_(1)  # ok: FC104
                self._decode_wrappers_cudagraph[batch_size] = wrapper
            return wrapper
        if self._decode_wrapper is None:
            self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self._get_workspace_buffer(), "NHD", use_tensor_cores=True)
        return self._decode_wrapper

    def _get_prefill_wrapper(self) -> BatchPrefillWithPagedKVCacheWrapper:
        if self._prefill_wrapper is None:
            self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._get_workspace_buffer(), "NHD")
        return self._prefill_wrapper

    def _get_cascade_wrapper(self) -> MultiLevelCascadeAttentionWrapper:
        if self._cascade_wrapper is None:
            ws = torch.zeros(self.attn_config.cascade_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
            self._cascade_wrapper = MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
        return self._cascade_wrapper

    def _pad_decodes(self, num_decodes: int) -> int:
        for size in self.cudagraph_sizes:
            if size >= num_decodes:
                return size
        return num_decodes

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata) -> FlashInferMetadata:
        m = common_attn_metadata
        num_reqs, page_size = m.num_reqs, self.page_size
        num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(m, self.reorder_batch_threshold)
        seq_lens_np = m.seq_lens_cpu[:num_reqs].numpy()
        num_blocks_np = (seq_lens_np + page_size - 1) // page_size
        block_table = m.block_table_tensor[:num_reqs]
        use_cascade = common_prefix_len > 0
        if use_cascade:
            num_common_blocks = common_prefix_len // page_size
            shared_qo_indptr_cpu = torch.tensor([0, m.num_actual_tokens], dtype=torch.int32)
            shared_kv_page_indptr_cpu = torch.tensor([0, num_common_blocks], dtype=torch.int32)
            shared_kv_page_indices = block_table[0, :num_common_blocks]
            shared_kv_last_page_len_cpu = torch.tensor([page_size], dtype=torch.int32)
            block_table = block_table[:, num_common_blocks:]
            num_blocks_np = num_blocks_np - num_common_blocks

        use_cudagraph = self.enable_cuda_graph and num_prefills == 0 and not use_cascade
        num_decodes_padded = self._pad_decodes(num_decodes) if use_cudagraph else num_decodes
        np.cumsum(num_blocks_np, out=self.paged_kv_indptr_np[1 : num_reqs + 1])
        self.paged_kv_indptr_np[num_reqs + 1 : num_decodes_padded + 1] = self.paged_kv_indptr_np[num_reqs]
        last = seq_lens_np % page_size
        self.paged_kv_last_page_len_np[:num_reqs] = np.where(last == 0, page_size, last)
        num_pages = int(self.paged_kv_indptr_np[num_reqs])

        num_blocks_dev = torch.from_numpy(num_blocks_np).to(self.device, non_blocking=True)
        mask = self.block_arange[: block_table.shape[1]].unsqueeze(0) < num_blocks_dev.unsqueeze(1)
        paged_kv_indices = block_table[mask]  # expect: FC101
        if num_pages > self.paged_kv_indices.numel():
            self.paged_kv_indices = torch.empty(2 * num_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        self.paged_kv_indices[:num_pages].copy_(paged_kv_indices)  # ok: FC104
        self.paged_kv_indptr[: num_decodes_padded + 1].copy_(self.paged_kv_indptr_cpu[: num_decodes_padded + 1], non_blocking=True)

        md = FlashInferMetadata(
            num_actual_tokens=m.num_actual_tokens, slot_mapping=m.slot_mapping, num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens, num_prefills=num_prefills, use_cascade=use_cascade,
        )
        if use_cascade:
            md.cascade_wrapper = self._get_cascade_wrapper()
            md.cascade_wrapper.plan(  # expect: FC102
                [shared_qo_indptr_cpu, m.query_start_loc],
                [shared_kv_page_indptr_cpu, self.paged_kv_indptr_cpu[: num_reqs + 1]],
                [shared_kv_page_indices, paged_kv_indices],
                [shared_kv_last_page_len_cpu, self.paged_kv_last_page_len_cpu[:num_reqs]],
                self.num_qo_heads, self.num_kv_heads, self.head_dim, page_size, causal=True, q_data_type=self.q_data_type,
            )
            return md
        if num_prefills > 0:
            md.prefill_wrapper = self._get_prefill_wrapper()
            s = num_decodes
            qo_indptr_cpu = m.query_start_loc_cpu[s : num_reqs + 1] - m.query_start_loc_cpu[s]
            kv_indptr_cpu = self.paged_kv_indptr_cpu[s : num_reqs + 1] - self.paged_kv_indptr_cpu[s]
            md.prefill_wrapper.plan(  # expect: FC102
                qo_indptr_cpu, kv_indptr_cpu, paged_kv_indices[int(self.paged_kv_indptr_np[s]) :], self.paged_kv_last_page_len[s:num_reqs],
                self.num_qo_heads, self.num_kv_heads, self.head_dim, page_size, causal=True, q_data_type=self.q_data_type,
            )
        if num_decodes > 0 and self.attn_config.use_trtllm_decode:
            md.trtllm_block_tables = block_table[:num_decodes]
            md.trtllm_seq_lens = m.seq_lens[:num_decodes]
            md.trtllm_workspace = self.trtllm_workspace
            md.max_seq_len = max(m.max_seq_len, int(seq_lens_np[:num_decodes].max()))
        elif num_decodes > 0:
            md.decode_wrapper = self._get_decode_wrapper(num_decodes_padded, use_cudagraph)
            fast_plan_decode(  # ok: FC102
                md.decode_wrapper, self.paged_kv_indptr_cpu[: num_decodes_padded + 1], self.paged_kv_indices,
                self.paged_kv_last_page_len_cpu[:num_decodes_padded], self.num_qo_heads, self.num_kv_heads, self.head_dim, page_size,
                self.q_data_type, self.kv_cache_dtype,
            )
            # padded graph rows must read a valid one-token page
            self.paged_kv_last_page_len[num_decodes:num_decodes_padded].fill_(1)  # expect: FC104
        return md

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> FlashInferMetadata:
        m = common_attn_metadata
        m.max_seq_len = int(m.seq_lens.max())  # expect: FC101
        return self.build(0, m)


class FlashInferImpl:
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int):
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self._sm_scale = scale  # ok: FC103

    def forward(self, layer, query, key, value, kv_cache, attn_metadata: FlashInferMetadata, output: torch.Tensor) -> torch.Tensor:
        n = attn_metadata.num_actual_tokens
        kv_cache[0].view(-1, self.num_kv_heads, self.head_size)[attn_metadata.slot_mapping] = key[:n]
        kv_cache[1].view(-1, self.num_kv_heads, self.head_size)[attn_metadata.slot_mapping] = value[:n]
        query = query[:n]
        if attn_metadata.use_cascade:
            output[:n] = attn_metadata.cascade_wrapper.run(query, kv_cache)
            return output
        nd = attn_metadata.num_decode_tokens
        if attn_metadata.prefill_wrapper is not None:
            output[nd:n] = attn_metadata.prefill_wrapper.run(query[nd:], kv_cache)  # expect: FC108
        if attn_metadata.decode_wrapper is not None:
            output[:nd] = attn_metadata.decode_wrapper.run(query[:nd], kv_cache)  # ok: FC108
        elif attn_metadata.trtllm_block_tables is not None:
            output[:nd] = trtllm_batch_decode_with_kv_cache(
                query=query[:nd], kv_cache=kv_cache, workspace_buffer=attn_metadata.trtllm_workspace,
                block_tables=attn_metadata.trtllm_block_tables, seq_lens=attn_metadata.trtllm_seq_lens,
                max_seq_len=attn_metadata.max_seq_len, bmm1_scale=self._sm_scale, bmm2_scale=1.0,
            )
        return output
