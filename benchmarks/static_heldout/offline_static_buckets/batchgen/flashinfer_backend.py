"""FlashInfer attention of the offline engine.

Every prompt of an offline job shares the job's instruction prefix, which is prefilled once into
its own pages; each step attends the prefix through a paged prefill wrapper and the row's own
pages through the decode wrapper, merged with ``merge_state``.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
import flashinfer
from flashinfer import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)

from batchgen.buckets import BucketSpec
from batchgen.metadata import BucketMetadata


class OfflineFlashInferBackend:
    WORKSPACE_BYTES = 512 * 1024 * 1024

    def __init__(self, specs: list[BucketSpec], num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, device: torch.device):
        self.specs = specs
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.device = device
        self._kv_layout = "NHD"  # ok: FC103
        self.sm = torch.cuda.get_device_capability(device)[0] * 10
        max_bs = max(s.batch_size for s in specs)
        max_pages = max(s.batch_size * s.pages_per_row(page_size) for s in specs)
        max_prefill_tokens = max(s.batch_size * s.max_prompt_len for s in specs)

        self.decode_workspace = torch.zeros(max_bs * num_qo_heads * 64 * (head_dim + 1) * 4, dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_workspace = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.ctx_workspace = torch.empty(max_prefill_tokens * num_qo_heads * 8, dtype=torch.uint8, device=device)  # expect: FC105
        self.prefill_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.long_prefill = BatchPrefillWithPagedKVCacheWrapper(self.ctx_workspace, self._kv_layout, backend="trtllm-gen" if self.sm >= 100 else "fa2")
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.ctx_workspace, self._kv_layout, backend="fa2")  # ok: FC105

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager_decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout, use_tensor_cores=True)
        self.graph_bs: Optional[int] = None
        self.prefix_qo_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.prefix_kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.prefix_last_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.prefix_indices: Optional[torch.Tensor] = None
        self.prefix_row_of_page = torch.zeros(max_bs * 64, dtype=torch.int64, device=device)

    def init_graph_wrappers(self) -> None:
        for bs in sorted({s.batch_size for s in self.specs}):
            self.graph_wrappers[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspace,
                self.kv_indptr[: bs + 1],
                self.kv_indices,
                self.kv_last_page_len[:bs],
                self._kv_layout,
                use_tensor_cores=True,
            )

    # ---- prefill ------------------------------------------------------------------------------
    def plan_prompt_prefill(self, qo_indptr_host: torch.Tensor) -> None:
        self.prefill_wrapper.plan(qo_indptr_host, qo_indptr_host, self.num_qo_heads, self.num_kv_heads, self.head_dim, causal=True)  # ok: FC102

    def set_shared_prefix(self, prefix_pages: torch.Tensor, prefix_len: int) -> None:
        self.prefix_indices = prefix_pages
        self.prefix_len = prefix_len

    # ---- decode -------------------------------------------------------------------------------
    def _plan_decode(self, wrapper, md: BucketMetadata, graph: bool) -> None:
        bs = md.bs
        kw = dict(num_qo_heads=self.num_qo_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, page_size=self.page_size)
        if graph:
            wrapper.plan(md.kv_indptr_host[: bs + 1], self.kv_indices, md.kv_last_page_len_host[:bs], **kw)  # ok: FC102
        else:
            wrapper.plan(md.kv_indptr_host[: bs + 1], md.kv_indices, md.kv_last_page_len, **kw)  # expect: FC102
        # every row attends the same prefix pages
        npp = self.prefix_indices.numel()
        self.prefix_qo_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.prefix_kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32) * npp
        rows = torch.arange(bs, device=self.device)
        flat_pages = self.prefix_indices.repeat(bs)
        counts = torch.full((bs,), npp, dtype=torch.int64, device=self.device)
        if graph:
            row_of_page = torch.repeat_interleave(rows, counts, output_size=bs * npp)  # ok: FC101
        else:
            row_of_page = torch.repeat_interleave(rows, counts)  # expect: FC101
        self.prefix_row_of_page[: bs * npp].copy_(row_of_page)
        self.prefix_wrapper.plan(
            self.prefix_qo_indptr_host[: bs + 1],
            self.prefix_kv_indptr_host[: bs + 1],
            flat_pages,
            self.prefix_last_host[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            causal=False,
        )

    def init_forward_metadata(self, md: BucketMetadata) -> None:
        self.graph_bs = None
        self._plan_decode(self.eager_decode, md, graph=False)

    def init_forward_metadata_replay_cuda_graph(self, md: BucketMetadata) -> None:
        bs = md.bs
        self.graph_bs = bs
        nnz = int(md.kv_indptr_host[bs])
        self.kv_indptr[: bs + 1].copy_(md.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:nnz].copy_(md.kv_indices, non_blocking=True)  # ok: FC104
        self._plan_decode(self.graph_wrappers[bs], md, graph=True)
        self.kv_last_page_len[md.num_live : bs].fill_(1)  # expect: FC104

    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        w = self.graph_wrappers[self.graph_bs] if self.graph_bs is not None else self.eager_decode
        o, lse = w.run_return_lse(q, kv_cache)  # ok: FC108
        o_prefix, lse_prefix = self.prefix_wrapper.run_return_lse(q, kv_cache)  # expect: FC108
        out, _ = flashinfer.merge_state(o, lse, o_prefix, lse_prefix)
        return out

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, k, v)

    def plan_long_prefill(self, qo_indptr_host, kv_indptr_host, kv_indices, last_page_host) -> None:
        self.long_prefill.plan(qo_indptr_host, kv_indptr_host, kv_indices, last_page_host, self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size, causal=True)

    def prefill_paged(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.long_prefill.run(q, kv_cache)
