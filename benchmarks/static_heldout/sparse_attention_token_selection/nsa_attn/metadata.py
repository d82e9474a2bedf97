"""Per-step batches and the metadata builder of the eager sparse decode path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from nsa import (
    LightningIndexer,
    SparseConfig,
    count_selected,
    host_selected_counts,
    pages_from_blocks,
    select_topk_blocks,
)


@dataclass
class DecodeBatch:
    batch_size: int
    hidden: torch.Tensor
    block_table: torch.Tensor
    num_pages: torch.Tensor
    num_pages_np: np.ndarray
    flat_pages: torch.Tensor
    seq_lens_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor
    page_keys: torch.Tensor


@dataclass
class PrefillBatch:
    batch_size: int
    extend_lens: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor


@dataclass
class SparseDecodeMeta:
    batch_size: int
    bucket: Optional[int]
    kv_indptr: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor
    sel_counts: torch.Tensor
    max_seq_len: int = 0
    use_dense: bool = False

    @property
    def num_selected(self) -> int:
        return int(self.sel_counts.sum())  # expect: FC101


class SparseMetadataBuilder:
    """Runs the indexer eagerly for batches larger than the biggest graph bucket."""

    def __init__(self, cfg: SparseConfig, indexer: LightningIndexer, device: torch.device):
        self.cfg = cfg
        self.indexer = indexer
        self.device = device
        self.block_scores = torch.zeros(
            cfg.max_batch, cfg.max_pages_per_req, dtype=torch.float32, device=device
        )
        self.kv_indptr = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.sel_scratch: Optional[torch.Tensor] = None
        self._plan_info = None  # ok: FC103

    def build(self, batch: DecodeBatch) -> SparseDecodeMeta:
        bs = batch.batch_size
        k = self.cfg.top_k_pages
        if self.block_scores.shape[0] < bs:
            self.block_scores = torch.zeros(bs, self.cfg.max_pages_per_req, dtype=torch.float32, device=self.device)  # expect: FC107
        if self.sel_scratch is None:
            self.sel_scratch = torch.empty(self.cfg.max_batch, k, dtype=torch.int64, device=self.device)  # ok: FC107

        scores = self.indexer(
            batch.hidden, batch.page_keys, batch.block_table, batch.num_pages, self.block_scores
        )
        topk_idx = select_topk_blocks(scores, k)
        counts = count_selected(topk_idx)
        if bs > self.sel_scratch.shape[0]:
            raise ValueError(f"batch {bs} > max_batch {self.sel_scratch.shape[0]}; selected per row: {counts}")  # ok: FC101
        if (counts == 0).any():  # expect: FC101
            raise RuntimeError("the indexer selected no page for a live request")
        self.sel_scratch[:bs, : topk_idx.shape[1]].copy_(topk_idx)

        pages = pages_from_blocks(batch.block_table, topk_idx)
        torch.cumsum(counts, 0, out=self.kv_indptr[1 : bs + 1])

        # the indexer always keeps a request's trailing page, so the real last-page lengths hold
        counts_np = host_selected_counts(batch.num_pages_np, k)
        self.kv_indptr_host[0] = 0
        self.kv_indptr_host[1 : bs + 1] = torch.from_numpy(np.cumsum(counts_np, dtype=np.int32))
        self.last_page_len_host[:bs].copy_(batch.last_page_len_cpu)
        max_len = int(batch.seq_lens_cpu.max())  # ok: FC101
        self._plan_info = (bs, max_len)
        return SparseDecodeMeta(
            batch_size=bs,
            bucket=None,
            kv_indptr=self.kv_indptr[: bs + 1],
            kv_indptr_host=self.kv_indptr_host[: bs + 1],
            kv_indices=pages,
            last_page_len_host=self.last_page_len_host[:bs],
            sel_counts=counts,
            max_seq_len=max_len,
        )
