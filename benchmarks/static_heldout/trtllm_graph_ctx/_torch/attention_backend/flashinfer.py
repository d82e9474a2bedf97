"""FlashInfer metadata, shaped like TensorRT-LLM's _torch/attention_backend/flashinfer.py."""

import contextlib
import os
from dataclasses import dataclass
from typing import Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from .interface import AttentionMetadata

_WS_BYTES = int(os.getenv("TRTLLM_FLASHINFER_WS") or 384 << 20)


@dataclass(kw_only=True)
class FlashInferAttentionMetadata(AttentionMetadata):
    page_size: int = 32
    workspace: Optional[torch.Tensor] = None
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None

    def __post_init__(self):
        super().__post_init__()
        if self.workspace is None:
            self.workspace = torch.empty(_WS_BYTES, dtype=torch.uint8, device="cuda")  # expect: FC106
        n = self.max_num_requests
        self.paged_kv_indptr_decode = torch.zeros(n + 1, dtype=torch.int32, device="cuda")
        self.paged_kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_last_page_len_host = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.paged_kv_indices = torch.zeros(n * 256, dtype=torch.int32, device="cuda")
        self.paged_kv_last_page_len = torch.ones(n, dtype=torch.int32, device="cuda")
        if self.is_cuda_graph:
            self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "HND",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.paged_kv_indptr_decode,
                paged_kv_indices_buffer=self.paged_kv_indices,
                paged_kv_last_page_len_buffer=self.paged_kv_last_page_len,
            )
        elif self.decode_wrapper is None:
            self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "HND")

    def reset_after_step(self):
        self.paged_kv_indptr_decode.zero_()  # expect: FC104
        self.paged_kv_indptr_host.zero_()  # ok: FC104

    @contextlib.contextmanager
    def capturing(self):
        self.decode_wrapper._use_cuda_graph = True  # expect: FC103
        try:
            yield self
        finally:
            self.decode_wrapper._use_cuda_graph = self.is_cuda_graph  # expect: FC103

    def prepare(self) -> None:
        n = len(self.seq_lens_cpu)
        self.paged_kv_indptr_host[1 : n + 1] = torch.cumsum((self.seq_lens_cpu + self.page_size - 1) // self.page_size, 0)
        self.paged_kv_indptr_decode[: n + 1].copy_(self.paged_kv_indptr_host[: n + 1], non_blocking=True)  # ok: FC104
        if self.paged_kv_indices.numel() < int(self.paged_kv_indptr_host[n]):  # ok: FC101
            self.paged_kv_indices = torch.zeros(  # expect: FC107
                int(self.paged_kv_indptr_host[n]) * 2, dtype=torch.int32, device="cuda"
            )
        self.decode_wrapper.plan(self.paged_kv_indptr_host[: n + 1], self.paged_kv_indices, self.paged_kv_last_page_len_host[:n], 32, 8, 128, self.page_size)  # ok: FC102
        self.decode_wrapper.plan(self.paged_kv_indptr_decode[: n + 1], self.paged_kv_indices, self.paged_kv_last_page_len[:n], 32, 8, 128, self.page_size)  # expect: FC102


class FlashInferTrtllmDecode:
    def __init__(self, max_batch_size: int, max_seq_len: int, num_heads: int):
        nbytes = max_batch_size * num_heads * max_seq_len * 4
        self.workspace = torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # expect: FC105
        self.zeroed_workspace = torch.empty(nbytes, dtype=torch.uint8, device="cuda").zero_()  # ok: FC105

    def run(self, q, kv_cache, block_tables, seq_lens, scratch: bool = False):
        ws = self.zeroed_workspace if scratch else self.workspace
        return trtllm_batch_decode_with_kv_cache(q, kv_cache, ws, block_tables, seq_lens, 4096)

    def run_zeroed(self, q, kv_cache, block_tables, seq_lens):
        return trtllm_batch_decode_with_kv_cache(q, kv_cache, self.zeroed_workspace, block_tables, seq_lens, 4096)
