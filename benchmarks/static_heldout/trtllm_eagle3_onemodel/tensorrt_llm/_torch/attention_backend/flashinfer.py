"""FlashInfer attention metadata for one-model EAGLE3: a target wrapper (1 + draft_len query tokens per request)
and one graph-mode decode wrapper per draft step, all planned in prepare() before the (replayed) forward."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from torch import nn
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import xqa_batch_decode_with_kv_cache
from flashinfer.page import append_paged_kv_cache

from tensorrt_llm._torch.pyexecutor.resource_manager import KVCacheManager


def _toggle_graph_mode(w, enabled: bool) -> bool:
    prev, w._use_cuda_graph = w._use_cuda_graph, enabled  # expect: FC103
    return prev


@dataclass(kw_only=True)
class FlashInferAttentionMetadata:
    max_num_requests: int
    max_num_tokens: int
    kv_cache_manager: KVCacheManager
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    max_draft_len: int = 0
    is_cuda_graph: bool = False
    use_trtllm_gen: bool = False
    use_xqa_draft: bool = False
    draft_workspace_bytes: int = 128 << 20
    request_ids: List[int] = field(default_factory=list)
    num_seqs: int = 0

    def __post_init__(self):
        n, max_pages = self.max_num_requests, self.max_num_requests * 1024
        with torch.device("cuda"):
            self.qo_indptr = torch.zeros(n + 1, dtype=torch.int32)
            self.kv_indptr = torch.zeros(n + 1, dtype=torch.int32)
            self.kv_indices = torch.zeros(max_pages, dtype=torch.int32)
            self.last_page_len = torch.zeros(n, dtype=torch.int32)
            self.kv_lens_cuda = torch.zeros(n, dtype=torch.int32)
            self.draft_kv_indptr = [torch.zeros(n + 1, dtype=torch.int32) for _ in range(self.max_draft_len)]
            self.draft_last_page_len = [torch.zeros(n, dtype=torch.int32) for _ in range(self.max_draft_len)]
        self.qo_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.seq_lens_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.kv_lens_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.draft_kv_indptr_host = [torch.zeros(n + 1, dtype=torch.int32, pin_memory=True) for _ in range(self.max_draft_len)]
        self.draft_last_page_len_host = [torch.zeros(n, dtype=torch.int32, pin_memory=True) for _ in range(self.max_draft_len)]
        self.batch_indices: Optional[torch.Tensor] = None

        self.target_workspace = torch.empty(self._target_workspace_bytes(), dtype=torch.uint8, device="cuda")  # expect: FC105
        self.target_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            self.target_workspace,
            "HND",
            use_cuda_graph=self.is_cuda_graph,
            qo_indptr_buf=self.qo_indptr,
            paged_kv_indptr_buf=self.kv_indptr,
            paged_kv_indices_buf=self.kv_indices,
            paged_kv_last_page_len_buf=self.last_page_len,
            backend="trtllm-gen" if self.use_trtllm_gen else "fa2",
        )
        self.draft_workspace = torch.empty(self.draft_workspace_bytes, dtype=torch.uint8, device="cuda")  # ok: FC105
        self.draft_wrappers = [
            BatchDecodeWithPagedKVCacheWrapper(
                self.draft_workspace,
                "HND",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.draft_kv_indptr[i],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.draft_last_page_len[i],
                backend="fa2",
            )
            for i in range(self.max_draft_len)
        ]
        # the draft model's context pass over the accepted tokens (trtllm-gen: zeroed workspace)
        self.ctx_workspace = torch.empty(self._target_workspace_bytes() // 2, dtype=torch.uint8, device="cuda")  # ok: FC105
        self.ctx_workspace.zero_()
        self.draft_ctx_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.ctx_workspace, "HND", backend="trtllm-gen")
        if self.use_xqa_draft:
            self.xqa_workspace = torch.zeros(int(os.getenv("TRTLLM_XQA_WORKSPACE_MB", "64")) << 20, dtype=torch.uint8, device="cuda")  # expect: FC106

    def _target_workspace_bytes(self) -> int:
        rows = self.max_num_requests * (self.max_draft_len + 1)
        return rows * self.num_heads * (self.head_dim + 1) * 4 * 8 + (16 << 20)

    def create_cuda_graph_metadata(self, batch_size: int) -> "FlashInferAttentionMetadata":
        return dataclasses.replace(self, max_num_requests=batch_size, is_cuda_graph=True, request_ids=[], num_seqs=0)

    @contextlib.contextmanager
    def eager_planning(self):
        """Plan the graph-mode wrappers once in eager mode so their JIT modules load before capture."""
        toggles = [functools.partial(_toggle_graph_mode, w) for w in self.draft_wrappers]
        prev = [t(False) for t in toggles]
        try:
            yield self
        finally:
            for t, p in zip(toggles, prev):
                t(p)

    def prepare(self) -> None:
        bs, ps = self.num_seqs, self.page_size
        kv_lens = self.kv_lens_cpu[:bs]
        max_kv_len = int(kv_lens.max())  # ok: FC101
        if max_kv_len > self.max_num_tokens:
            raise ValueError(f"kv length {max_kv_len} exceeds max_num_tokens={self.max_num_tokens}")
        pages = (kv_lens + ps - 1) // ps
        self.kv_indptr_host[1 : bs + 1] = torch.cumsum(pages, 0)
        self.last_page_len_host[:bs] = kv_lens - (pages - 1) * ps
        self.qo_indptr_host[1 : bs + 1] = torch.cumsum(self.seq_lens_cpu[:bs], 0)
        num_pages = int(self.kv_indptr_host[bs])
        self.kv_indices = torch.empty(2 * num_pages, dtype=torch.int32, device="cuda") if num_pages > self.kv_indices.numel() else self.kv_indices  # expect: FC107
        self.batch_indices = torch.arange(self.max_num_requests, dtype=torch.int32, device="cuda") if self.batch_indices is None else self.batch_indices  # ok: FC107
        flat = torch.tensor([b for ids in self.kv_cache_manager.get_batch_cache_indices(self.request_ids) for b in ids], dtype=torch.int32)
        self.kv_indices[:num_pages].copy_(flat, non_blocking=True)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_lens_cuda[:bs].copy_(kv_lens, non_blocking=True)
        plan_kwargs = dict(
            qo_indptr=self.qo_indptr_host[: bs + 1],
            paged_kv_indptr=self.kv_indptr_host[: bs + 1],
            paged_kv_indices=self.kv_indices[:num_pages],
            paged_kv_last_page_len=self.last_page_len_host[:bs],
            num_qo_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim_qk=self.head_dim,
            page_size=ps,
            causal=True,
        )
        self.target_wrapper.plan(**plan_kwargs)  # ok: FC102
        if self.max_draft_len:
            self.prepare_draft_steps(bs, kv_lens, num_pages)

    def prepare_draft_steps(self, bs: int, kv_lens: torch.Tensor, num_pages: int) -> None:
        """The draft context pass reads the target's layout; draft step i sees the target's tokens plus every
        accepted token plus i drafts, planned for the worst case."""
        ps = self.page_size
        self.draft_ctx_wrapper.plan(  # ok: FC102
            self.qo_indptr_host[: bs + 1],
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:num_pages],
            self.last_page_len_host[:bs],
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            ps,
            causal=True,
        )
        for i, w in enumerate(self.draft_wrappers):
            lens = kv_lens + self.max_draft_len + 1 + i
            pages = (lens + ps - 1) // ps
            indptr_host = self.draft_kv_indptr_host[i]
            indptr_host[1 : bs + 1] = torch.cumsum(pages, 0)
            self.draft_last_page_len_host[i][:bs] = lens - (pages - 1) * ps
            self.draft_kv_indptr[i][: bs + 1].copy_(indptr_host[: bs + 1], non_blocking=True)
            step_args = (self.draft_kv_indptr[i][: bs + 1], self.kv_indices, self.draft_last_page_len_host[i][:bs])
            w.plan(*step_args, self.num_heads, self.num_kv_heads, self.head_dim, ps)  # expect: FC102


class FlashInferAttention(nn.Module):
    def __init__(self, layer_idx: int, num_heads: int, num_kv_heads: int, head_dim: int, is_draft: bool = False, backend: str = "fa2"):
        super().__init__()
        self.layer_idx = layer_idx
        self.is_draft = is_draft
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self._backend = backend

    def forward(self, q, k, v, metadata: FlashInferAttentionMetadata, draft_step: Optional[int] = None) -> torch.Tensor:
        mgr = metadata.kv_cache_manager
        kv = mgr.get_buffers(mgr.layer_index(self.layer_idx, self.is_draft))
        append_paged_kv_cache(k, v, metadata.batch_indices, metadata.kv_lens_cuda, kv, metadata.kv_indices, metadata.kv_indptr, metadata.last_page_len)
        q = q.view(-1, self.num_heads, self.head_dim)
        if draft_step is None:
            return metadata.target_wrapper.run(q, kv)  # ok: FC108
        if draft_step < 0:
            return metadata.draft_ctx_wrapper.run(q, kv)  # expect: FC108
        if metadata.use_xqa_draft:
            return xqa_batch_decode_with_kv_cache(
                query=q, kv_cache=kv, workspace_buffer=metadata.xqa_workspace, block_tables=None,
                seq_lens=metadata.kv_lens_cuda, max_seq_len=metadata.max_num_tokens, bmm1_scale=self.head_dim**-0.5, bmm2_scale=1.0,
            )
        return metadata.draft_wrappers[draft_step].run(q, kv)  # ok: FC108
