"""FlashInfer attention: paged prefill, decode (FA2 or trtllm-gen) and graph-mode decode wrappers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from torch import nn

from qserve.attention.backends.common import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)
from qserve.config import EngineConfig, ModelConfig
from qserve.layers.linear import get_tensor_model_parallel_world_size

FLASHINFER_WORKSPACE_BYTES = 256 * 1024 * 1024
# trtllm-gen decode: semaphores and split-k partials for one sequence slot.
TRTLLM_SCRATCH_BYTES_PER_SEQ = 512 * 1024

_KV_CACHE_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}


def get_kv_cache_layout(engine_config: EngineConfig, sliding_window: Optional[int]) -> str:
    # trtllm-gen reads HND pages and has no sliding-window decode.
    return "HND" if engine_config.use_trtllm_decode and sliding_window is None else "NHD"


def _alloc_zeroed_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    buf.zero_()
    return buf


@dataclass
class FlashInferMetadata:
    num_actual_tokens: int
    num_decode_tokens: int
    num_prefills: int
    slot_mapping: torch.Tensor
    max_seq_len: int
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    window_decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None


class FlashInferMetadataBuilder(AttentionMetadataBuilder):
    def __init__(self, engine_config: EngineConfig, model_config: ModelConfig, device: torch.device) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        self.device = device
        self.page_size = engine_config.block_size
        self.max_num_reqs = engine_config.max_num_seqs
        self.max_num_tokens = engine_config.max_num_batched_tokens
        self.max_model_len = model_config.max_model_len
        self.num_qo_heads = model_config.num_attention_heads // tp_size
        self.num_kv_heads = max(1, model_config.num_key_value_heads // tp_size)
        self.head_dim = model_config.head_dim
        self.sm_scale = self.head_dim**-0.5
        self.sliding_window = model_config.sliding_window
        self.window_left = self.sliding_window - 1 if self.sliding_window is not None else -1
        self.q_dtype = model_config.torch_dtype
        self.kv_dtype = _KV_CACHE_DTYPES.get(engine_config.kv_cache_dtype, self.q_dtype)
        self.kv_layout = get_kv_cache_layout(engine_config, self.sliding_window)
        self.use_trtllm_decode = self.kv_layout == "HND"
        self._decode_backend = "trtllm-gen" if self.use_trtllm_decode else "fa2"
        self._plan_kwargs = dict(sm_scale=self.sm_scale, q_data_type=self.q_dtype, kv_data_type=self.kv_dtype)

        # Device page tables; the graph-mode decode wrappers are bound to them.
        self.paged_kv_indptr = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, device=device)
        # Enough pages for a full token budget; grows for long contexts.
        initial_pages = self.max_num_tokens // self.page_size + self.max_num_reqs
        self.paged_kv_indices = torch.zeros(initial_pages, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = torch.ones(self.max_num_reqs, dtype=torch.int32, device=device)
        self.slot_mapping = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)
        self._null_slots: Optional[torch.Tensor] = None
        # Pinned host mirrors, what plan() reads.
        self.paged_kv_indptr_cpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, device="cpu",
                                               pin_memory=True)
        self.paged_kv_last_page_len_cpu = torch.ones(self.max_num_reqs, dtype=torch.int32, device="cpu",
                                                     pin_memory=True)

        self._workspace_buffer = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        # Split-k partials of the longest chunk: an fp32 row and an lse per token and head, twice.
        prefill_workspace_bytes = 2 * self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 + (16 << 20)
        self._prefill_workspace = torch.empty(prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self._graph_workspace = _alloc_zeroed_workspace(engine_config.flashinfer_workspace_bytes, device)

        self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._prefill_workspace, self.kv_layout)
        if self.use_trtllm_decode:
            decode_workspace = torch.empty(self.max_num_reqs * TRTLLM_SCRATCH_BYTES_PER_SEQ, dtype=torch.uint8, device=device)  # expect: FC105
            self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(decode_workspace, self.kv_layout,
                                                                      backend="trtllm-gen")
        else:
            self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self._workspace_buffer, self.kv_layout)
        self._window_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self._workspace_buffer, self.kv_layout)
        self._graph_decode_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def _get_graph_decode_wrapper(self, batch_size: int) -> BatchDecodeWithPagedKVCacheWrapper:
        wrapper = self._graph_decode_wrappers.get(batch_size)
        if wrapper is None:
            wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self._graph_workspace, self.kv_layout, use_cuda_graph=True,
                paged_kv_indptr_buffer=self.paged_kv_indptr[: batch_size + 1],
                paged_kv_indices_buffer=self.paged_kv_indices,
                paged_kv_last_page_len_buffer=self.paged_kv_last_page_len[:batch_size],
                backend=self._decode_backend,
            )
            self._graph_decode_wrappers[batch_size] = wrapper
        return wrapper

    def build(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        num_reqs = common.num_reqs
        num_decodes = common.num_decodes
        num_prefills = common.num_prefills
        num_tokens = common.num_actual_tokens
        page_size = self.page_size

        max_seq_len = int(common.seq_lens[:num_reqs].max())  # expect: FC101
        if max_seq_len > self.max_model_len:
            raise ValueError(f"a sequence of {max_seq_len} tokens exceeds max_model_len={self.max_model_len}")

        # Page table on the host.
        seq_lens_cpu = common.seq_lens_cpu[:num_reqs]
        pages_per_req = (seq_lens_cpu + page_size - 1) // page_size
        indptr_cpu = self.paged_kv_indptr_cpu
        indptr_cpu[0] = 0
        torch.cumsum(pages_per_req, dim=0, dtype=torch.int32, out=indptr_cpu[1 : num_reqs + 1])
        indptr_host = indptr_cpu[: num_reqs + 1].tolist()  # ok: FC101
        num_pages = indptr_host[num_reqs]
        self.paged_kv_last_page_len_cpu[:num_reqs] = seq_lens_cpu - (pages_per_req - 1) * page_size
        block_table_cpu = common.block_table_cpu
        page_mask = torch.arange(block_table_cpu.shape[1]).unsqueeze(0) < pages_per_req.unsqueeze(1)
        indices_cpu = block_table_cpu[page_mask]  # ok: FC101

        if num_pages > self.paged_kv_indices.numel():
            self.paged_kv_indices = torch.empty(2 * num_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        self.paged_kv_indices[:num_pages].copy_(indices_cpu, non_blocking=True)  # ok: FC104
        self.paged_kv_indptr[: num_reqs + 1].copy_(indptr_cpu[: num_reqs + 1], non_blocking=True)
        self.paged_kv_last_page_len[:num_reqs].copy_(self.paged_kv_last_page_len_cpu[:num_reqs], non_blocking=True)

        bs = common.padded_num_reqs if common.use_cuda_graph else num_decodes
        if common.use_cuda_graph and bs > num_tokens:
            # Padded rows write their (unused) keys to the null block.
            if self._null_slots is None:
                self._null_slots = torch.zeros(self.max_num_reqs, dtype=torch.int64, device=self.device)  # ok: FC107
            self.slot_mapping = torch.cat([common.slot_mapping[:num_tokens], self._null_slots[: bs - num_tokens], self.slot_mapping[bs:]])  # expect: FC107
        else:
            self.slot_mapping[:num_tokens].copy_(common.slot_mapping[:num_tokens], non_blocking=True)

        prefill_wrapper = None
        if num_prefills > 0:
            qo_start = common.query_start_loc_cpu[num_decodes]
            kv_start = indptr_host[num_decodes]
            self._prefill_wrapper.plan(  # ok: FC102
                common.query_start_loc_cpu[num_decodes : num_reqs + 1] - qo_start,
                indptr_cpu[num_decodes : num_reqs + 1] - kv_start,
                self.paged_kv_indices[kv_start:num_pages],
                self.paged_kv_last_page_len_cpu[num_decodes:num_reqs],
                self.num_qo_heads, self.num_kv_heads, self.head_dim, page_size,
                causal=True, window_left=self.window_left, **self._plan_kwargs,
            )
            prefill_wrapper = self._prefill_wrapper

        decode_wrapper = None
        window_decode_wrapper = None
        if num_decodes > 0:
            if self.sliding_window is None:
                decode_wrapper = self._get_graph_decode_wrapper(bs) if common.use_cuda_graph else self._decode_wrapper
                decode_wrapper.plan(  # expect: FC102
                    self.paged_kv_indptr[: bs + 1], self.paged_kv_indices, self.paged_kv_last_page_len_cpu[:bs],
                    self.num_qo_heads, self.num_kv_heads, self.head_dim, page_size, **self._plan_kwargs,
                )
            else:
                window_decode_wrapper = self._window_decode_wrapper
                window_decode_wrapper.plan(  # expect: FC102
                    indptr_cpu[: bs + 1], self.paged_kv_indices, self.paged_kv_last_page_len[:bs],
                    self.num_qo_heads, self.num_kv_heads, self.head_dim, page_size,
                    window_left=self.window_left, **self._plan_kwargs,
                )

        if common.use_cuda_graph and bs > num_decodes:
            # Padded rows of the captured batch get empty page ranges.
            self.paged_kv_indptr[num_decodes + 1 : bs + 1] = self.paged_kv_indptr[num_decodes]  # expect: FC104

        return FlashInferMetadata(num_actual_tokens=num_tokens, num_decode_tokens=num_decodes,
                                  num_prefills=num_prefills, slot_mapping=self.slot_mapping[: max(bs, num_tokens)],
                                  max_seq_len=max_seq_len, prefill_wrapper=prefill_wrapper,
                                  decode_wrapper=decode_wrapper, window_decode_wrapper=window_decode_wrapper)

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        """Dummy decode metadata for capturing ``common.num_reqs`` rows: one page with one token each."""
        bs = common.num_reqs
        if common.num_prefills:
            raise ValueError("decode graphs are captured for decode-only batches")
        self.paged_kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.paged_kv_last_page_len_cpu[:bs] = 1
        self.paged_kv_indptr[: bs + 1].copy_(self.paged_kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.paged_kv_indices[:bs].zero_()
        self.slot_mapping[:bs].zero_()

        decode_wrapper = None
        window_decode_wrapper = None
        if self.sliding_window is None:
            decode_wrapper = self._get_graph_decode_wrapper(bs)
            decode_wrapper.plan(  # ok: FC102
                self.paged_kv_indptr_cpu[: bs + 1], self.paged_kv_indices, self.paged_kv_last_page_len_cpu[:bs],
                self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size, **self._plan_kwargs,
            )
        else:
            window_decode_wrapper = self._window_decode_wrapper
            window_decode_wrapper.plan(
                self.paged_kv_indptr_cpu[: bs + 1], self.paged_kv_indices, self.paged_kv_last_page_len_cpu[:bs],
                self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size,
                window_left=self.window_left, **self._plan_kwargs,
            )
        return FlashInferMetadata(num_actual_tokens=bs, num_decode_tokens=bs, num_prefills=0,
                                  slot_mapping=self.slot_mapping[:bs], max_seq_len=1,
                                  decode_wrapper=decode_wrapper, window_decode_wrapper=window_decode_wrapper)


class FlashInferImpl(AttentionImpl):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 sliding_window: Optional[int], kv_cache_dtype: str, kv_layout: str) -> None:
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.window_left = sliding_window - 1 if sliding_window is not None else -1
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_layout = kv_layout

    def _write_kv_cache(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        slot_mapping: torch.Tensor) -> None:
        block_size = kv_cache.shape[2] if self.kv_layout == "NHD" else kv_cache.shape[3]
        block_idx = slot_mapping // block_size
        block_off = slot_mapping % block_size
        if self.kv_layout == "NHD":
            kv_cache[block_idx, 0, block_off] = key.to(kv_cache.dtype)
            kv_cache[block_idx, 1, block_off] = value.to(kv_cache.dtype)
        else:
            kv_cache[block_idx, 0, :, block_off] = key.to(kv_cache.dtype)
            kv_cache[block_idx, 1, :, block_off] = value.to(kv_cache.dtype)

    def forward(self, layer: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: FlashInferMetadata, output: torch.Tensor) -> torch.Tensor:
        num_tokens = attn_metadata.num_actual_tokens
        num_decode_tokens = attn_metadata.num_decode_tokens
        query = query.view(-1, self.num_heads, self.head_size)
        out = output.view(-1, self.num_heads, self.head_size)
        self._write_kv_cache(kv_cache, key.view(-1, self.num_kv_heads, self.head_size),
                             value.view(-1, self.num_kv_heads, self.head_size), attn_metadata.slot_mapping)
        k_scale, v_scale = layer._k_scale_float, layer._v_scale_float

        prefill_wrapper = attn_metadata.prefill_wrapper
        if prefill_wrapper is not None:
            if prefill_wrapper._window_left != self.window_left:  # expect: FC103
                raise RuntimeError(f"{layer.layer_name}: prefill was planned for another sliding window")
            prefill_wrapper.run(  # ok: FC108
                query[num_decode_tokens:num_tokens], kv_cache, k_scale=k_scale, v_scale=v_scale,
                out=out[num_decode_tokens:num_tokens],
            )

        if num_decode_tokens > 0:
            if self.sliding_window is not None:
                window_wrapper = attn_metadata.window_decode_wrapper
                window_wrapper.run(  # expect: FC108
                    query[:num_decode_tokens], kv_cache, k_scale=k_scale, v_scale=v_scale, out=out[:num_decode_tokens]
                )
            else:
                attn_metadata.decode_wrapper.run(  # ok: FC108
                    query[:num_decode_tokens], kv_cache, k_scale=k_scale, v_scale=v_scale, out=out[:num_decode_tokens]
                )
        return output


class FlashInferBackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "FLASHINFER"

    @staticmethod
    def get_impl_cls() -> type[FlashInferImpl]:
        return FlashInferImpl

    @staticmethod
    def get_builder_cls() -> type[FlashInferMetadataBuilder]:
        return FlashInferMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           kv_layout: str) -> tuple[int, ...]:
        if kv_layout == "HND":
            return (num_blocks, 2, num_kv_heads, block_size, head_size)
        return (num_blocks, 2, block_size, num_kv_heads, head_size)
