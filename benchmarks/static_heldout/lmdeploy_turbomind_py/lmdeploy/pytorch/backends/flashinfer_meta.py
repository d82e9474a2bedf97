"""FlashInfer attention for the PyTorch engine: a metadata builder (prefill, eager decode, sliding-window
decode, graph-mode decode wrappers for the graph runner) and the attention implementation layers call."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from lmdeploy.pytorch.model_inputs import get_step_context

if TYPE_CHECKING:
    from lmdeploy.pytorch.model_inputs import StepContext

_FI_GRAPH_BUFFERS = ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf")


@dataclass
class FlashInferAttentionMetadata:
    is_decoding: bool
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    swa_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
    max_kv_seqlen: int = 0


class FlashInferMetaBuilder:
    WORKSPACE_BYTES = 256 << 20

    def __init__(self, model_config, cache_config, device: torch.device):
        self.device = device
        self.cache_config = cache_config
        self.num_heads = model_config.num_attention_heads
        self.num_kv_heads = model_config.num_key_value_heads
        self.head_dim = model_config.head_dim
        self.block_size = cache_config.block_size
        self.sliding_window = model_config.sliding_window
        self._kv_layout = "HND"
        self.workspace = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        swa_bytes = cache_config.max_batches * self.num_heads * self.head_dim * 4 * 8
        self.swa_workspace = torch.empty(swa_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self._prefill_kwargs = dict(backend="trtllm-gen" if cache_config.use_trtllm_prefill else "fa2")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout, **self._prefill_kwargs)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, self._kv_layout, use_tensor_cores=True)
        self.swa_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.swa_workspace, self._kv_layout, use_tensor_cores=True, backend="fa2")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.kv_indptr_host = torch.zeros(cache_config.max_batches + 1, dtype=torch.int32, pin_memory=True)

    @cached_property
    def prefill_workspace(self) -> torch.Tensor:
        nbytes = self.cache_config.max_prefill_token_num * self.num_heads * self.head_dim * 4 * 2
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)  # expect: FC105

    @staticmethod
    def _page_layout(kv_lens: np.ndarray, block_size: int, indptr_buf: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, int]:
        pages = (kv_lens + block_size - 1) // block_size
        indptr = indptr_buf[: len(kv_lens) + 1]
        indptr[1:] = torch.from_numpy(np.cumsum(pages, dtype=np.int32))
        rem = kv_lens % block_size
        last = torch.from_numpy(np.where(rem == 0, block_size, rem).astype(np.int32))
        return indptr, last, int(indptr[-1])  # ok: FC101

    @staticmethod
    def _flat_indices(block_offsets: np.ndarray, kv_lens: np.ndarray, block_size: int) -> np.ndarray:
        pages = (kv_lens + block_size - 1) // block_size
        return np.concatenate([row[:n] for row, n in zip(block_offsets, pages)]).astype(np.int32)

    def build(self, ctx: "StepContext") -> FlashInferAttentionMetadata:
        kv_lens = ctx.kv_seqlens_np
        indptr, last, _ = self._page_layout(kv_lens, self.block_size, self.kv_indptr_host)
        indices = torch.from_numpy(self._flat_indices(ctx.block_offsets_np, kv_lens, self.block_size)).to(self.device, non_blocking=True)
        md = FlashInferAttentionMetadata(is_decoding=ctx.is_decoding, max_kv_seqlen=ctx.max_kv_seqlen)
        if ctx.is_decoding:
            self.decode_wrapper.plan(indptr, indices, last, self.num_heads, self.num_kv_heads, self.head_dim, self.block_size)  # ok: FC102
            md.decode_wrapper = self.decode_wrapper
            if self.sliding_window:
                self.swa_decode_wrapper.plan(
                    indptr, indices, last, self.num_heads, self.num_kv_heads, self.head_dim, self.block_size, window_left=self.sliding_window - 1
                )
                md.swa_wrapper = self.swa_decode_wrapper
            return md
        qo_indptr = torch.cat([ctx.q_start_loc, ctx.q_start_loc[-1:] + ctx.q_seqlens[-1:]]).int()
        self.prefill_wrapper.plan(  # expect: FC102
            qo_indptr, indptr, indices, last, self.num_heads, self.num_kv_heads, self.head_dim, self.block_size, causal=True
        )
        md.prefill_wrapper = self.prefill_wrapper
        return md

    def make_graph_wrapper(self, bs: int, buffers: Dict[str, torch.Tensor]) -> BatchDecodeWithPagedKVCacheWrapper:
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, self._kv_layout, use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=buffers["kv_indptr"][: bs + 1],
            paged_kv_indices_buffer=buffers["kv_indices"],
            paged_kv_last_page_len_buffer=buffers["kv_last_page_len"][:bs],
        )
        buffers["kv_last_page_len"][:bs].fill_(1)  # ok: FC104
        self.graph_wrappers[bs] = wrapper
        return wrapper

    def plan_graph(self, bs: int, kv_lens: np.ndarray, block_offsets: np.ndarray) -> FlashInferAttentionMetadata:
        wrapper = self.graph_wrappers[bs]
        indptr, last, num_pages = self._page_layout(kv_lens, self.block_size, self.kv_indptr_host)
        # fill_buffers already wrote the page ids into the bound indices buffer
        indices = wrapper._paged_kv_indices_buf[:num_pages]  # expect: FC103
        wrapper.plan(indptr, indices, last, self.num_heads, self.num_kv_heads, self.head_dim, self.block_size)  # ok: FC102
        return FlashInferAttentionMetadata(is_decoding=True, decode_wrapper=wrapper)

    def graph_buffer_bytes(self) -> int:
        return sum(getattr(w, name).numel() * 4 for w in self.graph_wrappers.values() for name in _FI_GRAPH_BUFFERS)  # expect: FC103


class FlashInferAttentionImpl:
    def __init__(self, layer_idx: int, sliding_window: Optional[int] = None):
        self.layer_idx = layer_idx
        self.sliding_window = sliding_window

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        md: FlashInferAttentionMetadata = get_step_context().attn_metadata
        if not md.is_decoding:
            return md.prefill_wrapper.run(q, kv_cache)
        if self.sliding_window is not None:
            return md.swa_wrapper.run(q, kv_cache)  # expect: FC108
        return md.decode_wrapper.run(q, kv_cache)  # ok: FC108


def with_graph_decode(md: FlashInferAttentionMetadata, graph_md: FlashInferAttentionMetadata) -> FlashInferAttentionMetadata:
    """The step's metadata with the decode wrapper swapped for the bucket's graph-mode one."""
    return dataclasses.replace(md, decode_wrapper=graph_md.decode_wrapper)
