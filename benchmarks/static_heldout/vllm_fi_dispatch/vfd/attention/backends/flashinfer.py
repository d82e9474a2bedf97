"""FlashInfer attention backend: metadata builder with persistent buffers and graph-mode decode wrappers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from vfd import envs
from vfd.attention.backends.utils import (
    AttentionCGSupport,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    split_decodes_and_prefills,
)
from vfd.config import VllmConfig

logger = logging.getLogger(__name__)

_workspace_buffer: Optional[torch.Tensor] = None


def _get_workspace_buffer(device: torch.device) -> torch.Tensor:
    global _workspace_buffer
    if _workspace_buffer is None:
        buffer_size = envs.VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE
        _workspace_buffer = torch.zeros(buffer_size, dtype=torch.uint8, device=device)  # expect: FC106  # ok: FC105
    return _workspace_buffer


def get_kv_cache_layout() -> str:
    return "HND"


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def use_trtllm_attention(num_qo_heads: int, num_kv_heads: int, num_tokens: int, kv_cache_dtype: str) -> bool:
    if not envs.VLLM_USE_TRTLLM_DECODE_ATTENTION:
        return False
    return num_qo_heads % num_kv_heads == 0 and kv_cache_dtype == "auto"


class FlashInferBackend:
    accept_output_buffer: bool = True

    @staticmethod
    def get_name() -> str:
        return "FLASHINFER"

    @staticmethod
    def get_impl_cls() -> type["FlashInferImpl"]:
        return FlashInferImpl

    @staticmethod
    def get_builder_cls() -> type["FlashInferMetadataBuilder"]:
        return FlashInferMetadataBuilder


@dataclass
class FlashInferMetadata:
    num_actual_tokens: int
    slot_mapping: torch.Tensor
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    seq_lens: torch.Tensor
    block_table_tensor: torch.Tensor
    max_seq_len: int
    decode_use_trtllm: bool = False
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
    workspace_buffer: Optional[torch.Tensor] = None


class FlashInferMetadataBuilder(AttentionMetadataBuilder[FlashInferMetadata]):
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    reorder_batch_threshold: ClassVar[int] = 1

    def __init__(self, kv_cache_spec, layer_names, vllm_config: VllmConfig, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        model_config = vllm_config.model_config
        self.page_size = vllm_config.cache_config.block_size
        self.num_qo_heads = model_config.num_attention_heads
        self.num_kv_heads = model_config.num_kv_heads
        self.head_dim = model_config.head_size
        self.q_data_type = model_config.dtype
        self.cache_dtype = vllm_config.cache_config.cache_dtype
        self._kv_layout = get_kv_cache_layout()  # ok: FC103
        self._prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
        self._decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self._decode_wrappers_cudagraph: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

        compilation_config = vllm_config.compilation_config
        max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.max_num_reqs = max_num_reqs
        self.enable_cuda_graph = compilation_config.cudagraph_mode.decode_mode().has_full_cudagraphs()
        self._decode_cudagraph_max_bs = min(max_num_reqs, compilation_config.max_capture_size)
        max_num_pages = max_num_reqs * cdiv(model_config.max_model_len, self.page_size)

        # device buffers the graph-mode decode wrappers read; pinned mirrors plan() reads
        self.paged_kv_indptr = torch.zeros(max_num_reqs + 1, dtype=torch.int32, device=device)
        self.paged_kv_indptr_cpu = torch.zeros(max_num_reqs + 1, dtype=torch.int32, device="cpu", pin_memory=True)
        self.paged_kv_indptr_np = self.paged_kv_indptr_cpu.numpy()
        self.paged_kv_indices = torch.zeros(max_num_pages, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len_cpu = torch.zeros(max_num_reqs, dtype=torch.int32, device="cpu", pin_memory=True)
        self.paged_kv_last_page_len_np = self.paged_kv_last_page_len_cpu.numpy()
        self.block_arange = torch.arange(cdiv(model_config.max_model_len, self.page_size), device=device)

    def _get_prefill_wrapper(self) -> BatchPrefillWithPagedKVCacheWrapper:
        if self._prefill_wrapper is None:
            self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(
                _get_workspace_buffer(self.device), get_kv_cache_layout()
            )
        return self._prefill_wrapper

    def _get_decode_wrapper(self, batch_size: int, use_cudagraph: bool = False) -> BatchDecodeWithPagedKVCacheWrapper:
        if not use_cudagraph:
            if self._decode_wrapper is None:
                self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
                    _get_workspace_buffer(self.device), get_kv_cache_layout(), use_tensor_cores=True
                )
            return self._decode_wrapper
        wrapper = self._decode_wrappers_cudagraph.get(batch_size)
        if wrapper is None:
            wrapper = BatchDecodeWithPagedKVCacheWrapper(
                _get_workspace_buffer(self.device),
                get_kv_cache_layout(),
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.paged_kv_indptr[: batch_size + 1],
                paged_kv_indices_buffer=self.paged_kv_indices,
                paged_kv_last_page_len_buffer=self.paged_kv_last_page_len[:batch_size],
                use_tensor_cores=True,
            )
            self._decode_wrappers_cudagraph[batch_size] = wrapper
        return wrapper

    def set_kv_cache_layout(self, layout: str) -> None:
        """Switch layout after the KV cache is allocated (the connector may ask for HND)."""
        for wrapper in self._decode_wrappers_cudagraph.values():
            wrapper._kv_layout = layout  # expect: FC103
        self._kv_layout = layout

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> FlashInferMetadata:
        m = common_attn_metadata
        assert m.num_reqs == m.num_actual_tokens, "FlashInfer only supports decode-only full CUDAGraph capture"  # expect: FC109
        m.max_query_len = 1
        return self.build(0, m)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False) -> FlashInferMetadata:
        num_reqs = common_attn_metadata.num_reqs
        num_actual_tokens = common_attn_metadata.num_actual_tokens
        num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens = split_decodes_and_prefills(
            common_attn_metadata, decode_threshold=self.reorder_batch_threshold
        )
        page_size = self.page_size
        seq_lens = common_attn_metadata.seq_lens
        seq_lens_cpu = common_attn_metadata.seq_lens_cpu
        block_table_tensor = common_attn_metadata.block_table_tensor
        max_seq_len = int(seq_lens_cpu[:num_reqs].max())  # ok: FC101

        num_blocks_np = (seq_lens_cpu[:num_reqs].numpy() + page_size - 1) // page_size  # ok: FC101
        max_num_blocks = int(num_blocks_np.max())
        num_blocks = torch.from_numpy(num_blocks_np).to(self.device, non_blocking=True)
        mask = self.block_arange[:max_num_blocks].unsqueeze(0) < num_blocks.unsqueeze(1)
        paged_kv_indices = block_table_tensor[:num_reqs, :max_num_blocks][mask]  # expect: FC101

        num_indices = int(num_blocks_np.sum())
        if num_indices > self.paged_kv_indices.numel():
            logger.warning("growing paged_kv_indices to %d entries", 2 * num_indices)
            self.paged_kv_indices = torch.empty(2 * num_indices, dtype=torch.int32, device=self.device)  # expect: FC107
        self.paged_kv_indices[:num_indices].copy_(paged_kv_indices, non_blocking=True)  # ok: FC104

        self.paged_kv_indptr_np[0] = 0
        np.cumsum(num_blocks_np, out=self.paged_kv_indptr_np[1 : num_reqs + 1])
        self.paged_kv_indptr[: num_reqs + 1].copy_(self.paged_kv_indptr_cpu[: num_reqs + 1], non_blocking=True)  # ok: FC104
        last_page = seq_lens_cpu[:num_reqs].numpy() % page_size
        self.paged_kv_last_page_len_np[:num_reqs] = np.where(last_page == 0, page_size, last_page)  # ok: FC101

        workspace = _get_workspace_buffer(self.device)
        attn_metadata = FlashInferMetadata(
            num_actual_tokens=num_actual_tokens,
            slot_mapping=common_attn_metadata.slot_mapping,
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            num_prefills=num_prefills,
            num_prefill_tokens=num_prefill_tokens,
            seq_lens=seq_lens,
            block_table_tensor=block_table_tensor,
            max_seq_len=max_seq_len,
            workspace_buffer=workspace,
        )

        if num_prefills > 0:
            prefill_start = num_decodes
            qo_indptr_cpu = (
                common_attn_metadata.query_start_loc_cpu[prefill_start:] - common_attn_metadata.query_start_loc_cpu[prefill_start]
            )
            attn_metadata.prefill_wrapper = self._get_prefill_wrapper()
            attn_metadata.prefill_wrapper.plan(  # expect: FC102
                qo_indptr_cpu,
                self.paged_kv_indptr_cpu[prefill_start : num_reqs + 1],
                self.paged_kv_indices,
                self.paged_kv_last_page_len[prefill_start:num_reqs],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                page_size,
                causal=True,
                q_data_type=self.q_data_type,
            )

        if num_decodes > 0:
            attn_metadata.decode_use_trtllm = use_trtllm_attention(
                self.num_qo_heads, self.num_kv_heads, num_decode_tokens, self.cache_dtype
            )
            if not attn_metadata.decode_use_trtllm:
                use_cudagraph = self.enable_cuda_graph and num_decodes <= self._decode_cudagraph_max_bs
                pad = self.vllm_config.pad_for_cudagraph(num_decodes) if use_cudagraph else num_decodes
                if pad > num_decodes:
                    # padded requests: empty page lists, page length 1
                    self.paged_kv_indptr_np[num_decodes + 1 : pad + 1] = self.paged_kv_indptr_np[num_decodes]
                    self.paged_kv_last_page_len_np[num_decodes:pad] = 1
                decode_wrapper = self._get_decode_wrapper(pad, use_cudagraph)
                decode_wrapper.plan(  # ok: FC102
                    self.paged_kv_indptr_cpu[: pad + 1],
                    self.paged_kv_indices,
                    self.paged_kv_last_page_len_cpu[:pad],
                    self.num_qo_heads,
                    self.num_kv_heads,
                    self.head_dim,
                    page_size,
                    pos_encoding_mode="NONE",
                    q_data_type=self.q_data_type,
                )
                if pad > num_decodes:
                    self.paged_kv_last_page_len[num_decodes:pad].zero_()  # expect: FC104
                attn_metadata.decode_wrapper = decode_wrapper
        return attn_metadata


class FlashInferImpl:
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, sliding_window=None, logits_soft_cap=None):
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.window_left = sliding_window[0] if sliding_window is not None else -1
        self.logits_soft_cap = logits_soft_cap
        self.bmm1_scale = self.scale
        self.bmm2_scale = 1.0

    def forward(self, layer, query, key, value, kv_cache, attn_metadata: FlashInferMetadata, output=None):
        if attn_metadata is None:
            return output.fill_(0)
        num_actual_tokens = attn_metadata.num_actual_tokens
        torch.ops._C_cache_ops.reshape_and_cache_flash(
            key, value, kv_cache[:, 0], kv_cache[:, 1], attn_metadata.slot_mapping, "auto", layer._k_scale, layer._v_scale
        )
        kv_cache_permute = kv_cache.permute(0, 1, 3, 2, 4)
        num_decode_tokens = attn_metadata.num_decode_tokens
        if attn_metadata.num_prefills > 0:
            prefill_wrapper = attn_metadata.prefill_wrapper
            assert prefill_wrapper._window_left == self.window_left  # expect: FC103, FC109
            prefill_wrapper.run(
                query[num_decode_tokens:num_actual_tokens],
                kv_cache_permute,
                out=output[num_decode_tokens:num_actual_tokens],
            )
        if attn_metadata.num_decodes > 0:
            decode_query = query[:num_decode_tokens]
            if not attn_metadata.decode_use_trtllm:
                attn_metadata.decode_wrapper.run(decode_query, kv_cache_permute, out=output[:num_decode_tokens])  # ok: FC108
            else:
                trtllm_batch_decode_with_kv_cache(
                    query=decode_query,
                    kv_cache=kv_cache_permute,
                    workspace_buffer=attn_metadata.workspace_buffer,
                    block_tables=attn_metadata.block_table_tensor[: attn_metadata.num_decodes],
                    seq_lens=attn_metadata.seq_lens[: attn_metadata.num_decodes],
                    max_seq_len=attn_metadata.max_seq_len,
                    bmm1_scale=self.bmm1_scale,
                    bmm2_scale=self.bmm2_scale,
                    out=output[:num_decode_tokens],
                )
        return output
