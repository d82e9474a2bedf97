"""A prefill worker: ragged attention over the new tokens merged with paged attention over the
prefix-cache hits, then one transfer handle per request towards the decode pool."""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import flashinfer
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from pdkvx.config import PDConfig
from pdkvx.handles import KVTransferHandle, make_handle
from pdkvx.transport.registry import BaseTransport
from pdkvx.utils import PageAllocator, exclusive_cumsum, pages_and_last_len
from pdkvx_router.model import PDModel, make_kv_cache


@dataclass
class PrefillRequest:
    request_id: str
    prompt_ids: List[int]
    prefix_pages: List[int] = field(default_factory=list)
    prefix_len: int = 0
    src_pages: List[int] = field(default_factory=list)
    # pages reserved in the decode pool by the router
    dst_pages: List[int] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return len(self.prompt_ids) - self.prefix_len


@dataclass
class PrefillBatch:
    requests: List[PrefillRequest] = field(default_factory=list)

class PrefixCache(dict):
    """Full pages of earlier prompts, keyed by the hash of the token prefix they end."""

    def __init__(self, page_size: int):
        super().__init__()
        self.page_size = page_size

    def _keys(self, prompt_ids: List[int]) -> Iterator[int]:
        h, ps = 0, self.page_size
        for start in range(0, len(prompt_ids) - ps + 1, ps):
            h = hash((h, tuple(prompt_ids[start : start + ps])))
            yield h

    def match(self, prompt_ids: List[int]) -> Tuple[List[int], int]:
        pages = list(itertools.takewhile(lambda p: p is not None, map(self.get, self._keys(prompt_ids))))
        return pages, len(pages) * self.page_size


class PrefillWorker:
    def __init__(self, cfg: PDConfig, device: torch.device, rank: int, transport: Optional[BaseTransport] = None):
        self.cfg, self.device, self.rank, self.transport = cfg, device, rank, transport
        m = cfg.model
        self.ragged_workspace = torch.empty(cfg.ragged_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.paged_workspace = torch.zeros(int(os.getenv("PDKVX_PREFILL_WS_MB", "256")) << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, "NHD", backend="fa2")
        self.paged = BatchPrefillWithPagedKVCacheWrapper(self.paged_workspace, "NHD", backend="fa2")
        self.model = PDModel(m).to(device)
        self.kv_cache = make_kv_cache(m, cfg.num_pages, cfg.page_size, device)
        self.allocator = PageAllocator(cfg.num_pages)
        self.prefix_cache = PrefixCache(cfg.page_size)
        self.has_prefix = False
        self.slot_buf = torch.zeros(cfg.max_prefill_tokens, dtype=torch.int64, device=device)
        self.num_new = 0

    def forward_prefill(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        kv_cache: torch.Tensor) -> torch.Tensor:
        flat = kv_cache.view(-1, 2, *kv_cache.shape[-2:])
        slots = self.slot_buf[: self.num_new]
        flat[slots, 0] = k
        flat[slots, 1] = v
        o_new, lse_new = self.ragged.run_return_lse(q, k, v)
        if not self.has_prefix:
            return o_new
        o_pre, lse_pre = self.paged.run_return_lse(q, kv_cache)
        o, _ = flashinfer.merge_state(o_new, lse_new, o_pre, lse_pre)
        return o

    def _layout(self, batch: PrefillBatch) -> Tuple[List[int], List[int], List[int]]:
        """Token ids, positions and destination slots of the new tokens (host lists)."""
        ids, pos, slots = [], [], []
        page = self.cfg.page_size
        for r in batch.requests:
            n_pages = (len(r.prompt_ids) + page - 1) // page
            r.src_pages = r.prefix_pages + self.allocator.alloc(n_pages - len(r.prefix_pages))
            ids += r.prompt_ids[r.prefix_len :]
            pos += range(r.prefix_len, len(r.prompt_ids))
            slots += [r.src_pages[p // page] * page + p % page for p in range(r.prefix_len, len(r.prompt_ids))]
        return ids, pos, slots

    def run_prefill(self, batch: PrefillBatch) -> List[KVTransferHandle]:
        m = self.cfg.model
        page = self.cfg.page_size
        reqs = batch.requests
        ids, pos, slots = self._layout(batch)
        qo_lens = [r.new_tokens for r in reqs]
        qo_indptr_host = torch.tensor([0, *itertools.accumulate(qo_lens)], dtype=torch.int32)
        self.ragged.plan(  # ok: FC102
            qo_indptr_host, qo_indptr_host, m.num_qo_heads, m.num_kv_heads, m.head_dim, causal=True, q_data_type=torch.bfloat16
        )

        prefix_counts = [len(r.prefix_pages) for r in reqs]
        self.has_prefix = any(prefix_counts)
        if self.has_prefix:
            num_pages_gpu = torch.tensor(prefix_counts, dtype=torch.int32, device=self.device)
            kv_indptr_gpu = exclusive_cumsum(num_pages_gpu)
            flat_prefix = list(itertools.chain.from_iterable(r.prefix_pages for r in reqs))
            prefix_indices = torch.tensor(flat_prefix, dtype=torch.int32, device=self.device)
            prefix_lens_cpu = torch.tensor([r.prefix_len for r in reqs], dtype=torch.int32)
            _, last_len_cpu = pages_and_last_len(prefix_lens_cpu, page)
            self.paged.plan(  # expect: FC102
                qo_indptr_host, kv_indptr_gpu, prefix_indices, last_len_cpu, m.num_qo_heads, m.num_kv_heads, m.head_dim,
                page, causal=False, q_data_type=torch.bfloat16,
            )

        self.num_new = len(slots)
        self.slot_buf[: self.num_new].copy_(torch.tensor(slots, dtype=torch.int64), non_blocking=True)
        input_ids = torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True)
        positions = torch.tensor(pos, dtype=torch.int64).to(self.device, non_blocking=True)
        last_idx = (qo_indptr_host[1:] - 1).long().to(self.device, non_blocking=True)
        logits = self.model.prefill_forward(input_ids, positions, self, self.kv_cache, last_idx)
        first_tokens = logits.argmax(dim=-1).tolist()  # expect: FC101

        handles: List[KVTransferHandle] = []
        for r, tok in zip(reqs, first_tokens):
            self.prefix_cache.update(zip(self.prefix_cache._keys(r.prompt_ids), r.src_pages))
            same = self.transport is not None and self.transport.device == self.device
            h = make_handle(r.request_id, r.dst_pages, len(r.prompt_ids), tok, self.device, same)
            if self.transport is not None:
                self.transport.send(h, torch.tensor(r.src_pages, dtype=torch.int32))
            handles.append(h)
        return handles
