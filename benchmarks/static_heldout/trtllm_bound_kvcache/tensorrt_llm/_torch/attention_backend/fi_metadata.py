"""FlashInfer attention metadata for the PyTorch executor.

Everything that describes the requests of a step comes from the C++ runtime through the bindings: the request
state and chunk sizes from ``LlmRequest``, the block ids from ``KVCacheManager.get_batch_cache_indices``. Those
are plain Python ints and lists. This object turns them into the paged-KV description FlashInfer wants, keeps a
pinned host mirror of every index tensor (``plan()`` reads the host side), and owns the device tensors that the
KV-append kernel and the captured graphs read.

One instance serves eager steps. ``create_cuda_graph_metadata`` makes a copy per captured batch size with
``is_cuda_graph=True``; its wrappers then run in CUDA-graph mode over the buffers its ``__post_init__``
allocated, and ``prepare`` must leave those buffers exactly as ``plan()`` described them.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from tensorrt_llm.bindings import KVCacheManager, LlmRequest

logger = logging.getLogger(__name__)

# FlashInfer 0.2.x keeps the float workspace here; rebind_workspace() points a live wrapper at a grown one.
_WS_ATTRS = ("_float_workspace_buffer",)

_SPLIT_KV_MIN_LEN = 4096


@dataclass
class PlanParams:
    """Everything one ``plan()`` of the context (prefill) wrapper needs."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    causal: bool = True


@dataclass
class FlashInferAttentionMetadata:
    max_num_requests: int
    max_num_tokens: int
    max_blocks_per_seq: int
    max_draft_len: int
    kv_cache_manager: KVCacheManager
    workspace_buffer: torch.Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_seq_len: int
    is_cuda_graph: bool = False
    device: str = "cuda"

    def __post_init__(self) -> None:
        self.page_size = self.kv_cache_manager.tokens_per_block
        n = self.max_num_requests
        max_pages = n * self.max_blocks_per_seq

        # Device side: read by append_paged_kv_cache, trtllm-gen decode and (in graph mode) the wrappers.
        self.qo_indptr_cuda = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr_cuda = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_cuda = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len_cuda = torch.zeros(n, dtype=torch.int32, device=self.device)
        self.kv_lens_cuda = torch.zeros(n, dtype=torch.int32, device=self.device)
        self.block_tables_cuda = torch.zeros(n, self.max_blocks_per_seq, dtype=torch.int32, device=self.device)
        self.batch_indices_cuda = torch.zeros(self.max_num_tokens, dtype=torch.int32, device=self.device)
        self.positions_cuda = torch.zeros(self.max_num_tokens, dtype=torch.int32, device=self.device)

        # Host mirrors, pinned so the device copies are asynchronous.
        self.qo_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_host = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.kv_lens_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.block_tables_host = torch.zeros(n, self.max_blocks_per_seq, dtype=torch.int32, pin_memory=True)

        self.request_ids: List[int] = []
        self.num_contexts = 0
        self.num_generations = 0
        self.num_ctx_tokens = 0
        self.num_tokens = 0
        self.is_spec_decoding = False
        # (contexts, generations, kv pages) of the last plan, to skip re-planning an identical eager step
        self._plan_info: Optional[Tuple[int, int, int]] = None

        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            self.workspace_buffer,
            "HND",
            use_cuda_graph=self.is_cuda_graph,
            qo_indptr_buf=self.qo_indptr_cuda,
            paged_kv_indptr_buf=self.kv_indptr_cuda,
            paged_kv_indices_buf=self.kv_indices_cuda,
            paged_kv_last_page_len_buf=self.kv_last_page_len_cuda,
        )
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace_buffer,
            "HND",
            use_cuda_graph=self.is_cuda_graph,
            paged_kv_indptr_buffer=self.kv_indptr_cuda,
            paged_kv_indices_buffer=self.kv_indices_cuda,
            paged_kv_last_page_len_buffer=self.kv_last_page_len_cuda,
        )

    # ------------------------------------------------------------------ views

    @property
    def num_seqs(self) -> int:
        return self.num_contexts + self.num_generations

    @property
    def max_kv_len(self) -> int:
        # longest KV of the step; decides whether the decode plan may split the KV dimension
        return int(self.kv_lens_cuda[: self.num_seqs].max())  # expect: FC101

    def create_cuda_graph_metadata(self, batch_size: int) -> "FlashInferAttentionMetadata":
        return dataclasses.replace(
            self,
            max_num_requests=batch_size,
            max_num_tokens=batch_size * (1 + self.max_draft_len),
            is_cuda_graph=True,
        )

    # ------------------------------------------------------------------ per step

    def prepare(self, scheduled: Sequence[LlmRequest]) -> None:
        """Describe this step's requests: host state from the bindings, device buffers, then plan."""
        assert len(scheduled) <= self.max_num_requests, "scheduler returned more requests than the metadata holds"  # expect: FC109
        ctx = [r for r in scheduled if r.is_context_init_state]
        gen = [r for r in scheduled if not r.is_context_init_state]
        ordered = ctx + gen
        n = len(ordered)
        self.num_contexts, self.num_generations = len(ctx), len(gen)
        self.request_ids = [r.py_request_id for r in ordered]
        self.is_spec_decoding = any(len(r.py_draft_tokens) > 0 for r in gen)
        self._check_mirrors()

        q_lens = np.zeros(n, dtype=np.int32)
        kv_lens = np.zeros(n, dtype=np.int32)
        for i, req in enumerate(ordered):
            if req.is_context_init_state:
                begin = int(req.context_current_position)  # ok: FC101
                q_lens[i] = req.context_chunk_size
                kv_lens[i] = begin + req.context_chunk_size
            else:
                drafts = len(req.py_draft_tokens)
                q_lens[i] = 1 + drafts
                kv_lens[i] = req.max_beam_num_tokens + drafts
        self.num_ctx_tokens = int(q_lens[: self.num_contexts].sum())
        self.num_tokens = int(q_lens.sum())
        max_pages_seq = self._fill_host(q_lens, kv_lens)

        total_pages = int(self.kv_indptr_host[n])
        if max_pages_seq > self.block_tables_cuda.shape[1]:
            # a request grew past max_blocks_per_seq (attention window raised at run time)
            self.block_tables_host = torch.zeros(self.max_num_requests, max_pages_seq, dtype=torch.int32, pin_memory=True)  # ok: FC107
            self.block_tables_cuda = torch.zeros(self.max_num_requests, max_pages_seq, dtype=torch.int32, device=self.device)  # expect: FC107
            self._fill_host(q_lens, kv_lens)

        self.qo_indptr_cuda[: n + 1].copy_(self.qo_indptr_host[: n + 1], non_blocking=True)
        self.kv_indptr_cuda[: n + 1].copy_(self.kv_indptr_host[: n + 1], non_blocking=True)
        self.kv_indices_cuda[:total_pages].copy_(self.kv_indices_host[:total_pages], non_blocking=True)  # ok: FC104
        self.kv_last_page_len_cuda[:n].copy_(self.kv_last_page_len_host[:n], non_blocking=True)
        self.kv_lens_cuda[:n].copy_(self.kv_lens_host[:n], non_blocking=True)
        self.block_tables_cuda[:n].copy_(self.block_tables_host[:n], non_blocking=True)

        self._plan()
        if self.is_cuda_graph:
            # padded rows of the captured batch attend to one token of the dummy block
            self.kv_last_page_len_cuda[n:].fill_(1)  # expect: FC104

    def _fill_host(self, q_lens: np.ndarray, kv_lens: np.ndarray) -> int:
        n = kv_lens.shape[0]
        pages = (kv_lens + self.page_size - 1) // self.page_size
        last = kv_lens - (pages - 1) * self.page_size
        block_ids = self.kv_cache_manager.get_batch_cache_indices(self.request_ids)

        qo = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(q_lens, out=qo[1:])
        kvp = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(pages, out=kvp[1:])
        self.qo_indptr_host[: n + 1].copy_(torch.from_numpy(qo))
        self.kv_indptr_host[: n + 1].copy_(torch.from_numpy(kvp))
        self.kv_last_page_len_host[:n].copy_(torch.from_numpy(last.astype(np.int32)))
        self.kv_lens_host[:n].copy_(torch.from_numpy(kv_lens))

        width = self.block_tables_host.shape[1]
        max_pages_seq = 0
        for i, (ids, p) in enumerate(zip(block_ids, pages.tolist())):
            row = np.asarray(ids[:p], dtype=np.int32)
            self.kv_indices_host[kvp[i] : kvp[i] + p].copy_(torch.from_numpy(row))
            if p <= width:
                self.block_tables_host[i, :p].copy_(torch.from_numpy(row))
            max_pages_seq = max(max_pages_seq, p)
        return max_pages_seq

    def _plan(self) -> None:
        nc, n = self.num_contexts, self.num_seqs
        key = (nc, self.num_generations, int(self.kv_indptr_host[n]))
        if key == self._plan_info and not self.is_cuda_graph:  # ok: FC103
            return
        self._plan_info = key
        if nc > 0:
            self._plan_context(self._context_plan_params())
        if self.num_generations > 0 and not self.is_spec_decoding:
            start = int(self.kv_indptr_host[nc])
            kv_indptr = self.kv_indptr_host[nc : n + 1] - start
            split_kv = self.max_kv_len >= _SPLIT_KV_MIN_LEN
            self.decode_wrapper.plan(  # ok: FC102
                kv_indptr, self.kv_indices_host[start:], self.kv_last_page_len_host[nc:n], self.num_heads,
                self.num_kv_heads, self.head_dim, self.page_size, disable_split_kv=not split_kv,
            )

    def _context_plan_params(self) -> PlanParams:
        nc = self.num_contexts
        return PlanParams(
            qo_indptr=self.qo_indptr_cuda[: nc + 1],
            kv_indptr=self.kv_indptr_host[: nc + 1],
            kv_indices=self.kv_indices_host,
            kv_last_page_len=self.kv_last_page_len_host[:nc],
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            page_size=self.page_size,
        )

    def _plan_context(self, params: PlanParams) -> None:
        self.prefill_wrapper.plan(  # expect: FC102
            params.qo_indptr, params.kv_indptr, params.kv_indices, params.kv_last_page_len,
            params.num_heads, params.num_kv_heads, params.head_dim, params.page_size, causal=params.causal,
        )

    def _check_mirrors(self) -> None:
        assert self.num_contexts + self.num_generations == len(self.request_ids)  # ok: FC109

    # ------------------------------------------------------------------ start-up

    def rebind_workspace(self, workspace: torch.Tensor) -> None:
        """Point both wrappers at a larger float workspace after the executor grew it at start-up."""
        self.workspace_buffer = workspace
        for w in (self.prefill_wrapper, self.decode_wrapper):
            for name in _WS_ATTRS:
                setattr(w, name, workspace)  # expect: FC103
