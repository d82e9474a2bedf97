from dataclasses import dataclass
from typing import Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, MultiLevelCascadeAttentionWrapper

from vllm.envs import VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE
from vllm.v1.attention.backends.utils import CascadePlan, CommonAttentionMetadata

_PRIVATE_PLAN_STATE = ("_cached_module", "_plan_info")


@dataclass
class FlashInferCascadeMetadata:
    num_actual_tokens: int
    use_cascade: bool
    cascade_wrapper: Optional[MultiLevelCascadeAttentionWrapper] = None
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None


class FlashInferCascadeMetadataBuilder:
    def __init__(self, vllm_config, device):
        self.device = device
        self.page_size = vllm_config.cache_config.block_size
        self.heads = vllm_config.model_config.get_num_attention_heads()
        self.kv_heads = vllm_config.model_config.get_num_kv_heads()
        self.head_dim = vllm_config.model_config.get_head_size()
        max_reqs = vllm_config.scheduler_config.max_num_seqs
        max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self._workspace = torch.empty(VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE, dtype=torch.uint8, device=device)  # expect: FC106
        self._graph_workspace = torch.empty(max_tokens * self.heads * self.head_dim * 4, dtype=torch.uint8, device=device)  # ok: FC106, FC105
        self.paged_kv_indptr = torch.zeros(max_reqs + 1, dtype=torch.int32, device=device)
        self.paged_kv_indptr_cpu = torch.zeros(max_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_indices = torch.zeros(max_reqs * 512, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = torch.zeros(max_reqs, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len_cpu = torch.zeros(max_reqs, dtype=torch.int32, pin_memory=True)
        self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self._graph_workspace, "NHD", use_cuda_graph=True,
            paged_kv_indptr_buffer=self.paged_kv_indptr, paged_kv_indices_buffer=self.paged_kv_indices,
            paged_kv_last_page_len_buffer=self.paged_kv_last_page_len, backend="fa2",
        )
        self._cascade_wrapper = MultiLevelCascadeAttentionWrapper(2, self._workspace, "NHD")
        self.max_seq_len = vllm_config.model_config.max_model_len
        self.cascade_in_cudagraph = vllm_config.compilation_config.cascade_in_cudagraph

    def _fill_cpu(self, common: CommonAttentionMetadata):
        n = common.num_reqs
        blocks = (common.seq_lens_cpu + self.page_size - 1) // self.page_size
        self.paged_kv_indptr_cpu[1 : n + 1] = torch.cumsum(blocks, 0)
        self.paged_kv_last_page_len_cpu[:n] = (common.seq_lens_cpu - 1) % self.page_size + 1
        return n

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build=False):
        assert common_prefix_len % self.page_size == 0, "cascade prefix must be page aligned"  # expect: FC109
        assert self._workspace is not None  # ok: FC109
        common = common_attn_metadata
        if (common.seq_lens > self.max_seq_len).any():  # expect: FC101
            raise ValueError("sequence longer than max_model_len")
        longest = max(common.seq_lens)  # expect: FC101
        longest_cpu = int(common.seq_lens_cpu.max())  # ok: FC101
        n = self._fill_cpu(common)
        if common_prefix_len > 0:
            plan = self._cascade_plan(common, common_prefix_len)
            self._cascade_wrapper.plan(  # expect: FC102
                [plan.shared_qo_indptr_cpu, common.query_start_loc],
                [plan.shared_kv_page_indptr_cpu, self.paged_kv_indptr_cpu[: n + 1]],
                [plan.shared_kv_page_indices, self.paged_kv_indices],
                [plan.shared_kv_last_page_len_cpu, self.paged_kv_last_page_len_cpu[:n]],
                self.heads, self.kv_heads, self.head_dim, self.page_size, causal=True,
            )
            self._cascade_wrapper.plan(  # ok: FC102
                [plan.shared_qo_indptr_cpu, common.query_start_loc_cpu],
                [plan.shared_kv_page_indptr_cpu, self.paged_kv_indptr_cpu[: n + 1]],
                [plan.shared_kv_page_indices, self.paged_kv_indices],
                [plan.shared_kv_last_page_len_cpu, self.paged_kv_last_page_len_cpu[:n]],
                self.heads, self.kv_heads, self.head_dim, self.page_size, causal=True,
            )
            for attr in _PRIVATE_PLAN_STATE:
                if getattr(self._cascade_wrapper, attr, None) is None:  # expect: FC103
                    raise RuntimeError("cascade plan failed")
            return FlashInferCascadeMetadata(common.num_actual_tokens, True, cascade_wrapper=self._cascade_wrapper)
        self.paged_kv_indptr[: n + 1].copy_(self.paged_kv_indptr_cpu[: n + 1], non_blocking=True)  # ok: FC104
        self._decode_wrapper.plan(  # ok: FC102
            self.paged_kv_indptr_cpu[: n + 1], self.paged_kv_indices, self.paged_kv_last_page_len_cpu[:n],
            self.heads, self.kv_heads, self.head_dim, self.page_size,
        )
        self.paged_kv_last_page_len[:n].copy_(self.paged_kv_last_page_len_cpu[:n], non_blocking=True)  # expect: FC104
        if longest_cpu > self.paged_kv_indices.numel() * self.page_size:
            self.paged_kv_indices = torch.cat([self.paged_kv_indices, torch.zeros_like(self.paged_kv_indices)])  # expect: FC107
        self.paged_kv_indptr_cpu = torch.cat([self.paged_kv_indptr_cpu, self.paged_kv_indptr_cpu[-1:]])  # ok: FC107
        return FlashInferCascadeMetadata(common.num_actual_tokens, False, decode_wrapper=self._decode_wrapper)

    def _cascade_plan(self, common, prefix_len) -> CascadePlan:
        shared_pages = prefix_len // self.page_size
        return CascadePlan(
            torch.tensor([0, common.num_actual_tokens], dtype=torch.int32),
            torch.tensor([0, shared_pages], dtype=torch.int32),
            torch.tensor([self.page_size], dtype=torch.int32),
            common.block_table_tensor[0, :shared_pages],
        )

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata):
        prefix = self.page_size if self.cascade_in_cudagraph else 0
        return self.build(prefix, common_attn_metadata)


class FlashInferCascadeImpl:
    def forward(self, layer, query, kv_cache, attn_metadata: FlashInferCascadeMetadata, output=None):
        if attn_metadata.use_cascade:
            return attn_metadata.cascade_wrapper.run(query, kv_cache)  # expect: FC108
        return attn_metadata.decode_wrapper.run(query, kv_cache, out=output)  # ok: FC108
