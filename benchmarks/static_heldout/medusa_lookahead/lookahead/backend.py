"""Attention backend of the lookahead verifier: paged KV metadata, the n-gram tree mask, graph wrappers."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from . import limits as lim
from .drafting import LookaheadBranch
from .limits import SpecLimits


class PagedKVMixin:
    """Page-table bookkeeping; the backend allocates the device buffers and their host twins."""

    page_size: int

    def _fill_kv_host(self, seq_lens_cpu: torch.Tensor, bs: int) -> None:
        pages = (seq_lens_cpu[:bs] + self.page_size - 1) // self.page_size
        self.kv_indptr_host[1 : bs + 1] = torch.cumsum(pages, 0)
        self.kv_last_page_len_host[:bs] = (seq_lens_cpu[:bs] - 1) % self.page_size + 1

    def _fill_kv_indices(self, req_pool_indices: torch.Tensor, bs: int) -> None:
        rows = self.req_to_page[req_pool_indices[:bs]]
        starts = self.kv_indptr_host[:bs].tolist()  # ok: FC101
        ends = self.kv_indptr_host[1 : bs + 1].tolist()
        for i, (s, e) in enumerate(zip(starts, ends)):
            self.kv_indices[s:e] = rows[i, : e - s]


class TreeMaskMixin:
    """Verify mask: every query row sees its request's whole prefix and, among the new rows, its tree ancestors."""

    num_verify_tokens: int

    def _tree_from_parents(self, parents: np.ndarray) -> torch.Tensor:
        q = self.num_verify_tokens
        tree = np.eye(q, dtype=bool)
        for i in range(q):
            p = parents[i]
            while p >= 0:
                tree[i, p] = True
                p = parents[p]
        return torch.from_numpy(tree)

    def build_mask(self, seq_lens_cpu: torch.Tensor, parents_cpu: Optional[np.ndarray]) -> torch.Tensor:
        q = self.num_verify_tokens
        prefix_total = int(seq_lens_cpu.sum())  # ok: FC101
        mask = torch.empty(q * prefix_total + q * q * len(seq_lens_cpu), dtype=torch.bool)
        off = 0
        for i, n in enumerate(seq_lens_cpu.tolist()):
            tree = self.tree_template if parents_cpu is None else self._tree_from_parents(parents_cpu[i])
            block = torch.ones(q, n + q, dtype=torch.bool)
            block[:, n:] = tree
            mask[off : off + block.numel()] = block.view(-1)
            off += block.numel()
        return mask.pin_memory().to(self.device, non_blocking=True)

    def _mask_capacity(self, w: BatchPrefillWithPagedKVCacheWrapper) -> int:
        return w._custom_mask_buf.numel()  # expect: FC103


class LookaheadAttnBackend(PagedKVMixin, TreeMaskMixin):
    def __init__(self, limits: SpecLimits, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                 req_to_page: torch.Tensor, device, kv_layout: str = "NHD"):
        self.limits = limits
        self.device = device
        self.page_size = limits.page_size
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.num_verify_tokens = q = lim.NUM_VERIFY_TOKENS
        self._kv_layout = kv_layout  # ok: FC103
        self.req_to_page = req_to_page
        bs = limits.max_batch_size
        max_pages = bs * (limits.max_context_len // limits.page_size + 1)
        self.workspace = torch.empty(limits.verify_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105, FC106
        self.kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(bs, dtype=torch.int32, device=device)
        self.kv_last_page_len_host = torch.ones(bs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr = torch.arange(0, (bs + 1) * q, q, dtype=torch.int32, device=device)
        self.qo_indptr_host = torch.arange(0, (bs + 1) * q, q, dtype=torch.int32)
        self.mask_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=device)
        self.custom_mask_buf = torch.zeros(q * bs * (limits.max_context_len + q) // 8 + 1, dtype=torch.uint8, device=device)
        self.tree_template = torch.tril(torch.ones(q, q, dtype=torch.bool))
        self.eager_verify = BatchPrefillWithPagedKVCacheWrapper(self.workspace, kv_layout)
        self.fallback_decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace, kv_layout)
        self.graph_verify: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {}
        self.branch = LookaheadBranch(num_qo_heads, num_kv_heads, head_dim, bs, device)
        self.tree_positions: Optional[torch.Tensor] = None

    def plan_verify(self, wrapper: BatchPrefillWithPagedKVCacheWrapper, bs: int, custom_mask: torch.Tensor) -> None:
        wrapper.plan(  # ok: FC102
            self.qo_indptr_host[: bs + 1],
            self.kv_indptr_host[: bs + 1],
            self.kv_indices,
            self.kv_last_page_len_host[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            custom_mask=custom_mask,
            q_data_type=torch.bfloat16,
        )

    def init_forward_metadata(self, batch) -> None:
        bs = batch.batch_size
        self._fill_kv_host(batch.seq_lens_cpu, bs)
        self._fill_kv_indices(batch.req_pool_indices, bs)
        if self.tree_positions is None:
            self.tree_positions = torch.arange(self.num_verify_tokens, device=self.device)  # ok: FC107
        if batch.num_candidates == 0:
            # empty n-gram pool: a plain decode of the last token
            self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
            self.fallback_decode.plan(  # expect: FC102
                self.kv_indptr[: bs + 1],
                self.kv_indices,
                self.kv_last_page_len_host[:bs],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
            )
            return
        self.plan_verify(self.eager_verify, bs, self.build_mask(batch.seq_lens_cpu[:bs], batch.parents_cpu))

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor,
                                                 seq_lens_cpu: torch.Tensor) -> None:
        w = BatchPrefillWithPagedKVCacheWrapper(
            self.workspace,
            self._kv_layout,
            use_cuda_graph=True,
            qo_indptr_buf=self.qo_indptr[: bs + 1],
            paged_kv_indptr_buf=self.kv_indptr[: bs + 1],
            paged_kv_indices_buf=self.kv_indices,
            paged_kv_last_page_len_buf=self.kv_last_page_len[:bs],
            custom_mask_buf=self.custom_mask_buf,
            mask_indptr_buf=self.mask_indptr[: bs + 1],
        )
        self.graph_verify[bs] = w
        self._fill_kv_host(seq_lens_cpu, bs)
        self._fill_kv_indices(req_pool_indices, bs)
        self.plan_verify(w, bs, self.build_mask(seq_lens_cpu[:bs], None))

    def init_forward_metadata_replay_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                                                seq_lens_cpu: torch.Tensor, parents_cpu: Optional[np.ndarray]) -> None:
        w = self.graph_verify[bs]
        if int(seq_lens[:bs].max()) + self.num_verify_tokens > self.limits.max_context_len:  # expect: FC101
            raise ValueError("a request would verify past max_context_len")
        self._fill_kv_host(seq_lens_cpu, bs)
        self._fill_kv_indices(req_pool_indices, bs)
        mask = self.build_mask(seq_lens_cpu[:bs], parents_cpu)
        packed = (mask.numel() + 7) // 8
        if packed > self._mask_capacity(w):
            self.custom_mask_buf = torch.zeros(2 * packed, dtype=torch.uint8, device=self.device)  # expect: FC107
        self.qo_indptr[: bs + 1].copy_(self.qo_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.plan_verify(w, bs, mask)
        # a prefix that ends on a page boundary must not leave a zero-length last page
        self.kv_last_page_len[:bs].clamp_(min=1)  # expect: FC104

    def forward_verify(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int, use_graph: bool) -> torch.Tensor:
        w = self.graph_verify[bs] if use_graph else self.eager_verify
        return w.run(q, kv_cache)  # ok: FC108

    def forward_fallback(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.fallback_decode.run(q, kv_cache)
