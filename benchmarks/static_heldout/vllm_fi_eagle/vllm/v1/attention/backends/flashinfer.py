"""Attention layer with FlashInfer (vLLM v1 shape)."""

from functools import partial

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from vllm import envs
from vllm.v1.attention.backends.utils import CommonAttentionMetadata, split_decodes_and_prefills

trtllm_gen_workspace_buffer = None


def _get_trtllm_gen_workspace_buffer():
    global trtllm_gen_workspace_buffer
    if trtllm_gen_workspace_buffer is None:
        trtllm_gen_workspace_buffer = torch.zeros(envs.VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE, dtype=torch.uint8, device="cuda")  # expect: FC106  # ok: FC105
    return trtllm_gen_workspace_buffer


def fast_plan_decode(self, indptr_cpu, indices, last_page_len_cpu, seq_lens_cpu, num_qo_heads, num_kv_heads, head_dim, page_size):
    """Plan a graph-mode decode wrapper from host tensors only (no per-call device copies)."""
    batch_size = len(last_page_len_cpu)
    self._paged_kv_indptr_buf.copy_(indptr_cpu, non_blocking=True)  # expect: FC103
    self._plan_info = self._cached_module.plan(self._float_workspace_buffer, indptr_cpu, batch_size, num_qo_heads, num_kv_heads, page_size)  # expect: FC103


class FlashInferMetadataBuilder:
    def __init__(self, kv_cache_spec, vllm_config, device):
        self.device = device
        self.page_size = kv_cache_spec.block_size
        self.num_qo_heads = vllm_config.model_config.num_attention_heads
        self.num_kv_heads = kv_cache_spec.num_kv_heads
        self.head_dim = kv_cache_spec.head_size
        max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        max_num_pages = max_num_reqs * vllm_config.model_config.max_model_len // self.page_size
        self.max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.enable_cuda_graph = not vllm_config.model_config.enforce_eager
        self._workspace_buffer = torch.empty(envs.VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE, dtype=torch.uint8, device=device)  # expect: FC106  # ok: FC105
        self.paged_kv_indptr = torch.zeros(max_num_reqs + 1, dtype=torch.int32, device=device)
        self.paged_kv_indptr_cpu = torch.zeros(max_num_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_indptr_np = self.paged_kv_indptr_cpu.numpy()
        self.paged_kv_indices = torch.zeros(max_num_pages, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len_cpu = torch.zeros(max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.block_table_arange = torch.arange(max_num_pages // max_num_reqs, dtype=torch.int32, device=device)
        self._decode_wrappers_cudagraph = {}
        self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self._workspace_buffer, "NHD")
        self._plan_decode_eager = self._decode_wrapper.plan
        self._prefill_wrapper = None

    def _get_decode_wrapper(self, batch_size, use_cudagraph):
        if not use_cudagraph:
            return self._decode_wrapper
        if batch_size not in self._decode_wrappers_cudagraph:
            self._decode_wrappers_cudagraph[batch_size] = BatchDecodeWithPagedKVCacheWrapper(
                self._workspace_buffer,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.paged_kv_indptr[: batch_size + 1],
                paged_kv_indices_buffer=self.paged_kv_indices,
                paged_kv_last_page_len_buffer=self.paged_kv_last_page_len[:batch_size],
            )
        return self._decode_wrappers_cudagraph[batch_size]

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False):
        num_reqs = common_attn_metadata.num_reqs
        assert num_reqs <= self.paged_kv_last_page_len.shape[0]  # expect: FC109
        num_decodes, num_prefills = split_decodes_and_prefills(common_attn_metadata)
        seq_lens_cpu = common_attn_metadata.seq_lens_cpu
        block_table_tensor = common_attn_metadata.block_table_tensor
        max_seq_len = int(common_attn_metadata.seq_lens.max())  # expect: FC101
        max_seq_len_host = int(seq_lens_cpu.max())  # ok: FC101
        num_blocks_cpu = (seq_lens_cpu + self.page_size - 1) // self.page_size
        np.cumsum(num_blocks_cpu.numpy(), out=self.paged_kv_indptr_np[1 : num_reqs + 1])  # ok: FC101
        num_blocks = num_blocks_cpu.to(self.device, non_blocking=True)
        mask = self.block_table_arange[: block_table_tensor.shape[1]].unsqueeze(0) < num_blocks.unsqueeze(1)
        paged_kv_indices = block_table_tensor[:, : block_table_tensor.shape[1]][mask]  # expect: FC101
        self.paged_kv_indptr[: num_reqs + 1].copy_(self.paged_kv_indptr_cpu[: num_reqs + 1], non_blocking=True)  # ok: FC104
        self.paged_kv_last_page_len_cpu = torch.remainder(seq_lens_cpu, self.page_size).int()  # ok: FC107
        self.paged_kv_indices = paged_kv_indices.clone()  # expect: FC107
        use_cudagraph = self.enable_cuda_graph and num_prefills == 0
        decode = self._get_decode_wrapper(num_decodes, use_cudagraph)
        if use_cudagraph:
            plan_fn = partial(fast_plan_decode, decode)
            plan_fn(self.paged_kv_indptr_cpu[: num_decodes + 1], self.paged_kv_indices, self.paged_kv_last_page_len_cpu[:num_decodes], seq_lens_cpu[:num_decodes], self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)  # ok: FC102
        else:
            self._plan_decode_eager(self.paged_kv_indptr[: num_decodes + 1], self.paged_kv_indices, self.paged_kv_last_page_len[:num_decodes], self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)  # expect: FC102
        if num_prefills > 0:
            if self._prefill_wrapper is None:
                self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._workspace_buffer, "NHD")
            prefill = self._prefill_wrapper
            qo_indptr = common_attn_metadata.query_start_loc[num_decodes:] - common_attn_metadata.query_start_loc[num_decodes]
            prefill.plan(qo_indptr, self.paged_kv_indptr_cpu[num_decodes : num_reqs + 1], paged_kv_indices, self.paged_kv_last_page_len_cpu[num_decodes:num_reqs], self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size, causal=True)  # expect: FC102
        return max_seq_len, max_seq_len_host, decode


class FlashInferImpl:
    def __init__(self, num_heads, head_size, max_num_tokens, device):
        self.num_heads = num_heads
        self.head_size = head_size
        self.context_workspace = torch.empty(max_num_tokens * num_heads * 1024, dtype=torch.uint8, device=device)  # expect: FC105
        self.decode_workspace = _get_trtllm_gen_workspace_buffer()

    def forward_prefill(self, query, kv_cache, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv):
        return trtllm_batch_context_with_kv_cache(
            query, kv_cache, self.context_workspace, block_tables, seq_lens, max_q_len, max_kv_len,
            bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv,
        )
