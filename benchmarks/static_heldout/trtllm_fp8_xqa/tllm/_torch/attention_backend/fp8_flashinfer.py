"""FP8 paged-KV metadata: XQA (Hopper) or trtllm-gen (Blackwell) decode, FA2 fallback and context prefill."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from .interface import AttentionMetadata, register_backend
from .workspace import WorkspaceTier, alloc_workspace


class Fp8DecodeWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FA2 decode over the FP8 cache, for layers the fused decode kernels do not cover."""

    def plan(self, *args, **kwargs):
        if self._kv_layout != "HND":  # expect: FC103
            raise ValueError("the FP8 paged KV cache is stored HND")
        kwargs.setdefault("kv_data_type", torch.float8_e4m3fn)
        return super().plan(*args, **kwargs)


@register_backend("flashinfer_fp8")
@dataclass(kw_only=True)
class Fp8FlashInferMetadata(AttentionMetadata):
    page_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_seq_len: int
    decode_kernel: str = "xqa"  # "xqa" on Hopper, "trtllm-gen" on Blackwell, "fa2" otherwise
    graph_decode: dict[int, Fp8DecodeWrapper] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n, dev, self._kv_layout = self.max_num_requests, torch.device("cuda"), "HND"
        blocks = -(-self.max_seq_len // self.page_size)
        self.kv_lens_cuda = torch.zeros(n, dtype=torch.int32, device=dev)
        self.kv_lens_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self._prev_kv_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.block_tables_cuda = torch.zeros((n, blocks), dtype=torch.int32, device=dev)
        self.block_tables_host = torch.zeros((n, blocks), dtype=torch.int32, pin_memory=True)
        self.qo_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_cuda = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        self.kv_indices_cuda = torch.zeros(n * blocks, dtype=torch.int32, device=dev)
        self.kv_last_page_len_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cuda = torch.zeros(n, dtype=torch.int32, device=dev)
        # per (request, head): partial rows and the semaphores of the multi-block reduction
        split_bytes = n * self.num_heads * 256 * 1024
        self.xqa_workspace = alloc_workspace(split_bytes, dev)
        self.gen_workspace = self.kv_lens_cuda.new_empty((split_bytes,), dtype=torch.uint8)  # expect: FC105
        ctx_workspace = torch.empty(self.max_num_tokens * self.num_heads * 1024, dtype=torch.uint8, device=dev)  # ok: FC105
        ctx_workspace.fill_(0)
        self.ctx_workspace = ctx_workspace
        self.fallback_workspace = torch.zeros(WorkspaceTier.LARGE.nbytes(), dtype=torch.uint8, device=dev)  # expect: FC106
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.fallback_workspace, self._kv_layout)  # ok: FC103
        self.eager_decode = Fp8DecodeWrapper(self.fallback_workspace, self._kv_layout, use_tensor_cores=True)
        # the MTP draft layer decodes in the same graph as the target layers
        self.draft_decode = Fp8DecodeWrapper(self.fallback_workspace, self._kv_layout, use_tensor_cores=True)

    def create_graph_decode_wrapper(self, bs: int) -> Fp8DecodeWrapper:
        self.kv_last_page_len_cuda[:bs].fill_(self.page_size)  # ok: FC104
        self.graph_decode[bs] = Fp8DecodeWrapper(
            self.fallback_workspace, self._kv_layout, use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr_cuda[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices_cuda,
            paged_kv_last_page_len_buffer=self.kv_last_page_len_cuda[:bs],
        )
        return self.graph_decode[bs]

    def prepare(self) -> None:
        assert self.kv_cache_manager is not None, "prepare() ran before the KV cache manager was attached"  # ok: FC109
        n, nc = self.num_seqs, self.num_contexts
        if max(self.request_kv_lens, default=0) > self.max_seq_len:  # ok: FC101
            raise ValueError(f"a request exceeds max_seq_len={self.max_seq_len}")
        kv_lens = np.asarray(self.request_kv_lens, dtype=np.int32)
        self.kv_lens_host[:n] = torch.from_numpy(kv_lens)
        self.kv_lens_cuda[:n].copy_(self.kv_lens_host[:n], non_blocking=True)
        # block tables only change when some request crossed into a new page
        if not torch.equal(self.kv_lens_cuda[:n] // self.page_size, self._prev_kv_lens[:n] // self.page_size):  # expect: FC101
            self.block_tables_host[:n] = torch.from_numpy(self.kv_cache_manager.block_tables(n))
            self.block_tables_cuda = torch.full_like(self.block_tables_cuda, -1)  # expect: FC107
            self.block_tables_cuda[:n].copy_(self.block_tables_host[:n], non_blocking=True)
        self._prev_kv_lens[:n].copy_(self.kv_lens_cuda[:n])

        pages = (kv_lens + self.page_size - 1) // self.page_size
        indptr = self.kv_indptr_host.numpy()
        indptr[0] = 0
        np.cumsum(pages, out=indptr[1 : n + 1])
        self.kv_last_page_len_host[:n] = torch.from_numpy(kv_lens - (pages - 1) * self.page_size)
        flat = np.concatenate([self.block_tables_host[i, :p].numpy() for i, p in enumerate(pages)])
        self.kv_indices_cuda[: flat.size].copy_(torch.from_numpy(flat), non_blocking=True)  # ok: FC104
        self.kv_indptr_cuda[: n + 1].copy_(self.kv_indptr_host[: n + 1], non_blocking=True)
        self.kv_last_page_len_cuda[:n].copy_(self.kv_last_page_len_host[:n], non_blocking=True)
        if nc:
            qo = self.qo_indptr_host.numpy()
            qo[0] = 0
            np.cumsum(self.request_q_lens[:nc], out=qo[1 : nc + 1])
            self.prefill.plan(  # expect: FC102
                self.qo_indptr_host[: nc + 1], self.kv_indptr_host[: nc + 1], self.kv_indices_cuda, self.kv_last_page_len_cuda[:nc],
                self.num_heads, self.num_kv_heads, self.head_dim, self.page_size, causal=True, kv_data_type=torch.float8_e4m3fn,
            )
        if n > nc:
            decode = self.graph_decode[n] if self.is_cuda_graph else self.eager_decode
            for w in (decode, self.draft_decode):
                w.plan(  # ok: FC102
                    self.kv_indptr_host[nc : n + 1], self.kv_indices_cuda, self.kv_last_page_len_host[nc:n], self.num_heads,
                    self.num_kv_heads, self.head_dim, self.page_size, q_data_type=torch.bfloat16,
                )
