"""FlashInfer backend of the v0 engine: attention state, per-step metadata, its builder and the impl."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from .state import CommonAttentionState, CommonMetadataBuilder, WindowCompatMixin

FLASHINFER_WORKSPACE_BUFFER_SIZE = 256 * 1024 * 1024
# split-k partial outputs and semaphores of the trtllm-gen decode kernel, per running sequence
_TRTLLM_BYTES_PER_SEQ = 1 << 20


@dataclass
class FlashInferMetadata:
    num_prefills: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_real_decodes: int
    slot_mapping: torch.Tensor
    seq_lens_gpu: Optional[torch.Tensor] = None
    max_decode_seq_len: int = 0
    query_start_loc: Optional[torch.Tensor] = None
    paged_kv_indptr_cpu: Optional[torch.Tensor] = None
    paged_kv_indices: Optional[torch.Tensor] = None
    paged_kv_last_page_len_cpu: Optional[torch.Tensor] = None
    block_tables: Optional[torch.Tensor] = None
    num_qo_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    page_size: int = 16
    kv_data_type: torch.dtype = torch.bfloat16
    q_data_type: torch.dtype = torch.bfloat16
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    trtllm_workspace: Optional[torch.Tensor] = None

    @property
    def prefill_metadata(self) -> Optional["FlashInferMetadata"]:
        return self if self.num_prefills > 0 else None

    @property
    def decode_metadata(self) -> Optional["FlashInferMetadata"]:
        return self if self.num_decode_tokens > 0 else None

    def begin_forward(self) -> None:
        np_ = self.num_prefills
        if self.num_prefill_tokens > 0:
            self.prefill_wrapper.plan(  # expect: FC102
                self.query_start_loc[: np_ + 1],
                self.paged_kv_indptr_cpu[: np_ + 1],
                self.paged_kv_indices,
                self.paged_kv_last_page_len_cpu[:np_],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                causal=True,
                q_data_type=self.q_data_type,
                kv_data_type=self.kv_data_type,
            )
        if self.num_decode_tokens > 0 and self.trtllm_workspace is None:
            self.decode_wrapper.plan(  # ok: FC102
                self.paged_kv_indptr_cpu[np_:],
                self.paged_kv_indices,
                self.paged_kv_last_page_len_cpu[np_:],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                q_data_type=self.q_data_type,
                kv_data_type=self.kv_data_type,
            )


class FlashInferState(WindowCompatMixin, CommonAttentionState):
    def __init__(self, runner):
        super().__init__(runner)
        self._workspace_buffer: Optional[torch.Tensor] = None
        self._trtllm_workspace: Optional[torch.Tensor] = None
        self._prefill_wrapper = None
        self._decode_wrapper = None
        self._graph_decode_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        window = runner.model_config.sliding_window
        self._window_left = window - 1 if window else -1  # ok: FC103
        self.use_trtllm_decode = runner.use_trtllm_decode

    def _decode_tensor_cores(self) -> bool:
        cfg = self.runner.model_config
        return cfg.num_attention_heads // cfg.num_kv_heads >= 4

    def _get_workspace_buffer(self) -> torch.Tensor:
        if self._workspace_buffer is None:
            self._workspace_buffer = torch.empty(FLASHINFER_WORKSPACE_BUFFER_SIZE, dtype=torch.uint8, device=self.runner.device)  # expect: FC106  # ok: FC105
        return self._workspace_buffer

    def _get_trtllm_workspace(self) -> torch.Tensor:
        if self._trtllm_workspace is None:
            nbytes = self.runner.scheduler_config.max_num_seqs * _TRTLLM_BYTES_PER_SEQ
            self._trtllm_workspace = torch.empty(nbytes, dtype=torch.uint8, device=self.runner.device)  # expect: FC105  # ok: FC106, FC107
        return self._trtllm_workspace

    def _get_prefill_wrapper(self) -> BatchPrefillWithPagedKVCacheWrapper:
        if self._prefill_wrapper is None:
            self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._get_workspace_buffer(), "NHD")
            self.apply_window(self._prefill_wrapper, self._window_left)
        return self._prefill_wrapper

    def _get_decode_wrapper(self) -> BatchDecodeWithPagedKVCacheWrapper:
        if self._decode_wrapper is None:
            self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self._get_workspace_buffer(), "NHD", use_tensor_cores=self._decode_tensor_cores()
            )
            self.apply_window(self._decode_wrapper, self._window_left)
        return self._decode_wrapper

    @contextmanager
    def graph_capture(self, max_batch_size: int):
        with super().graph_capture(max_batch_size):
            dev = self.runner.device
            self._graph_decode_workspace_buffer = self._get_workspace_buffer()
            self._graph_indices_buffer = torch.empty(
                max_batch_size * self.runner.max_blocks_per_seq, dtype=torch.int32, device=dev
            )
            self._graph_indptr_buffer = torch.zeros(max_batch_size + 1, dtype=torch.int32, device=dev)
            self._graph_last_page_len_buffer = torch.ones(max_batch_size, dtype=torch.int32, device=dev)
            self._graph_slot_mapping = torch.full((max_batch_size,), -1, dtype=torch.int64, device=dev)
            yield

    def graph_capture_get_metadata_for_batch(self, batch_size: int, is_encoder_decoder_model: bool = False):
        wrapper = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            self._graph_decode_workspace_buffer,
            self._graph_indptr_buffer[: batch_size + 1],
            self._graph_indices_buffer,
            self._graph_last_page_len_buffer[:batch_size],
            "NHD",
            self._decode_tensor_cores(),
        )
        self.apply_window(wrapper, self._window_left)
        self._graph_decode_wrappers[batch_size] = wrapper
        self._graph_last_page_len_buffer[:batch_size].fill_(1)  # ok: FC104
        cfg = self.runner.model_config
        meta = FlashInferMetadata(
            num_prefills=0,
            num_prefill_tokens=0,
            num_decode_tokens=batch_size,
            num_real_decodes=batch_size,
            slot_mapping=self._graph_slot_mapping[:batch_size],
            paged_kv_indptr_cpu=torch.arange(batch_size + 1, dtype=torch.int32),
            paged_kv_indices=self._graph_indices_buffer[:batch_size],
            paged_kv_last_page_len_cpu=torch.ones(batch_size, dtype=torch.int32),
            num_qo_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=self.runner.block_size,
            decode_wrapper=wrapper,
        )
        meta.begin_forward()
        return meta

    def begin_forward(self, model_input) -> None:
        meta = model_input.attn_metadata
        meta.prefill_wrapper = self._get_prefill_wrapper()
        if model_input.use_cuda_graph:
            meta.decode_wrapper = self._graph_decode_wrappers[model_input.graph_batch_size]
            n = meta.paged_kv_indices.numel()
            meta.decode_wrapper._paged_kv_indices_buf[:n].copy_(meta.paged_kv_indices, non_blocking=True)  # expect: FC103  # ok: FC104
        else:
            meta.decode_wrapper = self._get_decode_wrapper()
        if self.use_trtllm_decode and meta.decode_metadata is not None:
            meta.trtllm_workspace = self._get_trtllm_workspace()
        meta.begin_forward()

    def prepare_graph_input_buffers(self, input_buffers, attn_metadata, is_encoder_decoder_model: bool = False) -> None:
        super().prepare_graph_input_buffers(input_buffers, attn_metadata, is_encoder_decoder_model)
        needed = attn_metadata.paged_kv_indices.numel()
        if needed > self._graph_indices_buffer.numel():
            self._graph_indices_buffer.resize_(needed)  # expect: FC107
        # padded rows of the graph batch replay one token of page 0
        real, bs = attn_metadata.num_real_decodes, attn_metadata.num_decode_tokens
        self._graph_last_page_len_buffer[real:bs].fill_(1)  # expect: FC104


class FlashInferMetadataBuilder(CommonMetadataBuilder):
    def build(self, seq_lens: List[int], query_lens: List[int], cuda_graph_pad_size: int, batch_size: int):
        num_real_decodes = len(seq_lens) - sum(1 for d in self.input_builder.inter_data_list if d.is_prompt)
        super().build(seq_lens, query_lens, cuda_graph_pad_size, batch_size)
        device = self.runner.device
        max_query_len = max(query_lens)  # ok: FC101
        assert max_query_len > 0, f"query_lens: {query_lens}"  # expect: FC109
        seq_lens_gpu = torch.tensor(self.prefill_seq_lens + self.decode_seq_lens, dtype=torch.int32, device=device)
        max_decode_seq_len = int(seq_lens_gpu[self.num_prefills :].max()) if self.num_decode_tokens else 0  # expect: FC101
        query_lens_gpu = torch.tensor(query_lens, dtype=torch.int32, device=device)
        query_start_loc = torch.zeros(len(query_lens) + 1, dtype=torch.int32, device=device)
        torch.cumsum(query_lens_gpu, dim=0, dtype=torch.int32, out=query_start_loc[1:])
        width = max(len(b) for b in self.block_tables)
        table = [b + [0] * (width - len(b)) for b in self.block_tables]
        cfg = self.runner.model_config
        return FlashInferMetadata(
            num_prefills=self.num_prefills,
            num_prefill_tokens=self.num_prefill_tokens,
            num_decode_tokens=self.num_decode_tokens,
            num_real_decodes=num_real_decodes,
            slot_mapping=torch.tensor(self.slot_mapping, dtype=torch.int64, device=device),
            seq_lens_gpu=seq_lens_gpu,
            max_decode_seq_len=max_decode_seq_len,
            query_start_loc=query_start_loc,
            paged_kv_indptr_cpu=torch.tensor(self.paged_kv_indptr, dtype=torch.int32),
            paged_kv_indices=torch.tensor(self.paged_kv_indices, dtype=torch.int32, device=device),
            paged_kv_last_page_len_cpu=torch.tensor(self.paged_kv_last_page_len, dtype=torch.int32),
            block_tables=torch.tensor(table, dtype=torch.int32, device=device),
            num_qo_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=self.page_size,
        )


class FlashInferImpl:
    def __init__(self, num_heads: int, head_size: int, scale: float, use_trtllm_decode: bool = False):
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.use_trtllm_decode = use_trtllm_decode

    def forward(self, query, kv_cache, attn_metadata: FlashInferMetadata) -> torch.Tensor:
        nt = attn_metadata.num_prefill_tokens
        out = torch.empty_like(query)
        if prefill_meta := attn_metadata.prefill_metadata:
            out[:nt] = prefill_meta.prefill_wrapper.run(query[:nt], kv_cache)
        if decode_meta := attn_metadata.decode_metadata:
            if self.use_trtllm_decode:
                out[nt:] = trtllm_batch_decode_with_kv_cache(
                    query=query[nt:],
                    kv_cache=kv_cache,
                    workspace_buffer=decode_meta.trtllm_workspace,
                    block_tables=decode_meta.block_tables[decode_meta.num_prefills :],
                    seq_lens=decode_meta.seq_lens_gpu[decode_meta.num_prefills :],
                    max_seq_len=decode_meta.max_decode_seq_len,
                    bmm1_scale=self.scale,
                    bmm2_scale=1.0,
                )
            else:
                out[nt:] = decode_meta.decode_wrapper.run(query[nt:], kv_cache)  # ok: FC108
        return out
