"""FlashInfer metadata builders (one per KV-cache group) and the attention impl."""
from __future__ import annotations

import bisect
import operator
from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from ..kv_cache_interface import KVCacheSpec, SlidingWindowSpec, cdiv
from .workspace import get_shared_workspace

# what a decode wrapper was planned with, checked against the layer before it runs
_PLANNED_WINDOW = operator.attrgetter("_window_left")


@dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_seq_len: int
    block_table_np: np.ndarray
    slot_mapping: torch.Tensor


@dataclass
class FlashInferMetadata:
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    max_seq_len: int
    slot_mapping: torch.Tensor
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    window_decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None


class FlashInferGroupBuilder:
    cudagraph_support: ClassVar[bool] = True

    def __init__(self, group_id: int, spec: KVCacheSpec, layer_names: tuple[str, ...], vllm_config, device: torch.device) -> None:
        self.group_id, self.layer_names, self.device = group_id, layer_names, device
        model_cfg, sched_cfg = vllm_config.model_config, vllm_config.scheduler_config
        self.num_qo_heads = model_cfg.num_attention_heads // vllm_config.parallel_config.tensor_parallel_size
        self.num_kv_heads, self.head_dim, self.page_size = spec.num_kv_heads, spec.head_size, spec.block_size
        self.q_dtype, self.kv_dtype = model_cfg.dtype, spec.dtype
        self.max_num_reqs = n = sched_cfg.max_num_seqs
        self.capture_sizes = sorted(vllm_config.compilation_config.cudagraph_capture_sizes)
        self._window_left = -1
        self.paged_kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.paged_kv_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_indptr_np = self.paged_kv_indptr_cpu.numpy()
        # sized for a token budget of fresh pages; prefix-cache hits can go past it and grow it
        self._paged_kv_indices = torch.zeros(cdiv(sched_cfg.max_num_batched_tokens, self.page_size) + n, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = torch.empty(n, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len.fill_(self.page_size)  # ok: FC104
        self.paged_kv_last_page_len_cpu = torch.full((n,), self.page_size, dtype=torch.int32, pin_memory=True)
        self._workspace = get_shared_workspace(device)
        self._decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self._prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
        self._graph_decode_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    @property
    def paged_kv_indices(self) -> torch.Tensor:
        return self._paged_kv_indices

    @property
    def indices_capacity(self) -> int:
        return self._paged_kv_indices.numel()

    @indices_capacity.setter
    def indices_capacity(self, num_pages: int) -> None:
        # grow to the next power of two
        self._paged_kv_indices = torch.empty(1 << (num_pages - 1).bit_length(), dtype=torch.int32, device=self.device)  # expect: FC107

    def build(self, common_prefix_len: int, common: CommonAttentionMetadata, use_cudagraph: bool = False) -> FlashInferMetadata:
        assert common_prefix_len == 0, "cascade attention is not used with hybrid KV-cache groups"  # expect: FC109
        num_reqs, qsl_cpu = common.num_reqs, common.query_start_loc_cpu
        # decodes come first: the first request with more than one query token starts the prefills
        is_prefill = np.diff(qsl_cpu[: num_reqs + 1].numpy()) > 1
        num_decodes = int(is_prefill.argmax()) if is_prefill.any() else num_reqs  # ok: FC101
        num_decode_tokens = int(common.query_start_loc[num_decodes])  # expect: FC101

        seq_lens_np = common.seq_lens_cpu[:num_reqs].numpy()
        pages_np = (seq_lens_np + self.page_size - 1) // self.page_size
        self.paged_kv_indptr_np[0] = 0
        np.cumsum(pages_np, out=self.paged_kv_indptr_np[1 : num_reqs + 1])
        num_pages = int(self.paged_kv_indptr_np[num_reqs])
        last = seq_lens_np % self.page_size
        self.paged_kv_last_page_len_cpu[:num_reqs] = torch.from_numpy(np.where(last == 0, self.page_size, last))
        if num_pages > self.indices_capacity:
            self.indices_capacity = num_pages
        flat = np.concatenate([common.block_table_np[i, :p] for i, p in enumerate(pages_np)] or [np.zeros(0, np.int32)])
        self.paged_kv_indices[:num_pages].copy_(torch.from_numpy(flat), non_blocking=True)  # ok: FC104
        self.paged_kv_indptr[: num_reqs + 1].copy_(self.paged_kv_indptr_cpu[: num_reqs + 1], non_blocking=True)
        self.paged_kv_last_page_len[:num_reqs].copy_(self.paged_kv_last_page_len_cpu[:num_reqs], non_blocking=True)

        md = FlashInferMetadata(common.num_actual_tokens, num_decodes, num_decode_tokens, common.max_seq_len, common.slot_mapping)
        padded = self._plan_decode(md, common, num_decodes, use_cudagraph) if num_decodes else 0
        if num_reqs > num_decodes:
            self._plan_prefill(md, qsl_cpu, num_decodes, num_reqs)
        if padded > num_decodes:
            # padded rows of a graph batch are empty requests ending at the last real page
            self.paged_kv_indptr[num_decodes + 1 : padded + 1].fill_(num_pages)  # expect: FC104
        # keep the host rows past the batch valid for the next padded plan
        self.paged_kv_last_page_len_cpu[num_reqs:].fill_(self.page_size)  # ok: FC104
        return md

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        return self.build(0, common, use_cudagraph=True)

    def _get_decode_wrapper(self, batch_size: int, use_cudagraph: bool) -> BatchDecodeWithPagedKVCacheWrapper:
        if not use_cudagraph:
            if self._decode_wrapper is None:
                self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD", use_tensor_cores=True)
            return self._decode_wrapper
        if batch_size not in self._graph_decode_wrappers:
            self._graph_decode_wrappers[batch_size] = BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.paged_kv_indptr[: batch_size + 1],
                paged_kv_indices_buffer=self.paged_kv_indices,
                paged_kv_last_page_len_buffer=self.paged_kv_last_page_len[:batch_size],
            )
        return self._graph_decode_wrappers[batch_size]

    def _plan_decode(self, md: FlashInferMetadata, common: CommonAttentionMetadata, num_decodes: int, use_cudagraph: bool) -> int:
        padded = num_decodes
        if use_cudagraph and (i := bisect.bisect_left(self.capture_sizes, num_decodes)) < len(self.capture_sizes):
            padded = self.capture_sizes[i]
        wrapper = self._get_decode_wrapper(padded, use_cudagraph)
        wrapper.plan(  # ok: FC102
            self.paged_kv_indptr_cpu[: padded + 1], self.paged_kv_indices, self.paged_kv_last_page_len_cpu[:padded],
            self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size,
            window_left=self._window_left,  # ok: FC103
            q_data_type=self.q_dtype, kv_data_type=self.kv_dtype,
        )
        md.decode_wrapper = wrapper
        return padded

    def _plan_prefill(self, md: FlashInferMetadata, qsl_cpu: torch.Tensor, num_decodes: int, num_reqs: int) -> None:
        if self._prefill_wrapper is None:
            self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._prefill_wrapper.plan(  # expect: FC102
            qsl_cpu[num_decodes : num_reqs + 1] - qsl_cpu[num_decodes],
            self.paged_kv_indptr_cpu[num_decodes : num_reqs + 1], self.paged_kv_indices,
            self.paged_kv_last_page_len[num_decodes:num_reqs],
            self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size,
            causal=True, window_left=self._window_left, q_data_type=self.q_dtype, kv_data_type=self.kv_dtype,
        )
        md.prefill_wrapper = self._prefill_wrapper


class SlidingWindowGroupBuilder(FlashInferGroupBuilder):
    # window layers are planned eagerly over the pages still inside the window
    cudagraph_support: ClassVar[bool] = False

    def __init__(self, group_id: int, spec: SlidingWindowSpec, layer_names: tuple[str, ...], vllm_config, device: torch.device) -> None:
        super().__init__(group_id, spec, layer_names, vllm_config, device)
        self.window = spec.sliding_window
        self._window_left = self.window - 1
        # split-k partials for the largest step: tokens x heads x (head_dim + lse) in fp32
        ws_bytes = vllm_config.scheduler_config.max_num_batched_tokens * self.num_qo_heads * (self.head_dim + 1) * 4
        self._window_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self._window_decode = BatchDecodeWithPagedKVCacheWrapper(self._window_workspace, "NHD", use_tensor_cores=True)
        self._window_indptr: Optional[torch.Tensor] = None
        self._window_indptr_cpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, pin_memory=True)

    def _plan_decode(self, md: FlashInferMetadata, common: CommonAttentionMetadata, num_decodes: int, use_cudagraph: bool) -> int:
        skipped = ((common.seq_lens[:num_decodes] - self.window).clamp(min=0) // self.page_size).tolist()  # expect: FC101
        starts = self.paged_kv_indptr_np[:num_decodes] + np.asarray(skipped, dtype=np.int32)
        ends = self.paged_kv_indptr_np[1 : num_decodes + 1]
        win_np = self._window_indptr_cpu.numpy()
        win_np[0] = 0
        np.cumsum(ends - starts, out=win_np[1 : num_decodes + 1])
        keep = torch.from_numpy(np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]))
        if self._window_indptr is None:
            self._window_indptr = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, device=self.device)  # ok: FC107
        # the decode kernel reads indptr from device memory
        self._window_indptr[: num_decodes + 1].copy_(self._window_indptr_cpu[: num_decodes + 1], non_blocking=True)
        plan_kwargs = dict(
            indptr=self._window_indptr[: num_decodes + 1],
            indices=self.paged_kv_indices[keep.to(self.device, non_blocking=True)],
            last_page_len=self.paged_kv_last_page_len_cpu[:num_decodes],
        )
        self._window_decode.plan(  # expect: FC102
            **plan_kwargs, num_qo_heads=self.num_qo_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            page_size=self.page_size, window_left=self._window_left, q_data_type=self.q_dtype, kv_data_type=self.kv_dtype,
        )
        md.window_decode_wrapper = self._window_decode
        return num_decodes


class FlashInferImpl:
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, sliding_window: Optional[int] = None) -> None:
        self.num_heads, self.head_size, self.scale, self.num_kv_heads = num_heads, head_size, scale, num_kv_heads
        self.window_left = sliding_window - 1 if sliding_window else -1

    def forward(self, query, key, value, kv_cache: torch.Tensor, md: FlashInferMetadata, output: torch.Tensor) -> torch.Tensor:
        n = md.num_actual_tokens
        kv_cache[:, 0].flatten(0, 1).index_copy_(0, md.slot_mapping, key[:n])
        kv_cache[:, 1].flatten(0, 1).index_copy_(0, md.slot_mapping, value[:n])
        nd = md.num_decode_tokens
        if md.prefill_wrapper is not None:
            md.prefill_wrapper.run(query[nd:n], kv_cache, out=output[nd:n])
        if md.num_decodes == 0:
            return output
        if md.window_decode_wrapper is not None:
            md.window_decode_wrapper.run(query[:nd], kv_cache, out=output[:nd])  # expect: FC108
        else:
            planned_window = _PLANNED_WINDOW(md.decode_wrapper)  # expect: FC103
            if planned_window != self.window_left:
                raise RuntimeError(f"decode wrapper planned with window_left={planned_window}, layer uses {self.window_left}")
            md.decode_wrapper.run(query[:nd], kv_cache, out=output[:nd])  # ok: FC108
        return output
