"""Tree verification on FlashInfer paged prefill with a custom mask; graph-mode wrappers per (batch, tree size)."""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from .drafter import Eagle2Config
from .batch import SpecForwardBatch
from .tree import DynamicTree, pack_tree_mask


class TreeVerifyBackend:
    def __init__(self, cfg: Eagle2Config, max_seq_len: int, device: torch.device) -> None:
        self.cfg, self.max_seq_len, self.device = cfg, max_seq_len, device
        self.buckets = [(bs, ts) for bs in cfg.verify_bs for ts in cfg.tree_sizes]
        ws_bytes = cfg.max_bs * max(cfg.tree_sizes) * cfg.num_heads * (cfg.head_dim + 1) * 4 * 16
        self.workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.eager_verify = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
        self.verify_wrappers: Dict[Tuple[int, int], BatchPrefillWithPagedKVCacheWrapper] = {}
        self.init_verify_buffers()

    def init_verify_buffers(self) -> None:
        cfg, dev = self.cfg, self.device
        max_bs, max_ts = cfg.max_bs, max(cfg.tree_sizes)
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages, dtype=torch.int32, device=dev)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.mask_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.custom_mask = torch.empty(max_bs * max_ts * (self.max_seq_len + max_ts) // 8, dtype=torch.uint8, device=dev)
        self.custom_mask.zero_()  # ok: FC104
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        for bs, ts in self.buckets:
            self.verify_wrappers[(bs, ts)] = BatchPrefillWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, backend="fa2",
                qo_indptr_buf=self.qo_indptr[: bs + 1], paged_kv_indptr_buf=self.kv_indptr[: bs + 1],
                paged_kv_indices_buf=self.kv_indices, paged_kv_last_page_len_buf=self.kv_last_page_len[:bs],
                custom_mask_buf=self.custom_mask, mask_indptr_buf=self.mask_indptr[: bs + 1])
        assert len(self.verify_wrappers) == len(self.buckets), "duplicate verify bucket"  # ok: FC109

    def _host_layout(self, fb: SpecForwardBatch, bs: int, tree_size: int) -> int:
        """Pages per request (prefix + tree) into the pinned mirrors, padded rows empty; returns the page count."""
        ps, raw_bs = self.cfg.page_size, fb.batch_size
        kv_lens = fb.seq_lens_cpu[:raw_bs].numpy() + tree_size
        pages = -(-kv_lens // ps)
        self.kv_indptr_host[1 : raw_bs + 1] = torch.from_numpy(np.cumsum(pages).astype(np.int32))
        self.kv_indptr_host[raw_bs + 1 : bs + 1] = self.kv_indptr_host[raw_bs]
        self.last_page_len_host[:raw_bs] = torch.from_numpy((kv_lens - (pages - 1) * ps).astype(np.int32))
        return int(self.kv_indptr_host[raw_bs])

    def prepare_verify(self, bs: int, tree_size: int, fb: SpecForwardBatch, tree: DynamicTree) -> BatchPrefillWithPagedKVCacheWrapper:
        assert (bs, tree_size) in self.verify_wrappers, f"no verify graph for bs={bs}, tree={tree_size}"  # expect: FC109
        cfg, raw_bs = self.cfg, fb.batch_size
        nnz = self._host_layout(fb, bs, tree_size)
        self.qo_indptr_host = torch.arange(bs + 1, dtype=torch.int32) * tree_size  # ok: FC107
        n_bytes = int(((tree_size * (fb.seq_lens[:raw_bs] + tree_size) + 7) // 8).sum())  # expect: FC101
        if n_bytes > self.custom_mask.numel():
            self.custom_mask = torch.zeros(2 * n_bytes, dtype=torch.uint8, device=self.device)  # expect: FC107
        self.kv_indices[:nnz].copy_(fb.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        w = self.verify_wrappers[(bs, tree_size)]
        w.plan(self.qo_indptr_host, self.kv_indptr_host[: bs + 1], self.kv_indices[:nnz],  # ok: FC102
               self.last_page_len_host[:bs], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
               packed_custom_mask=self.custom_mask[:n_bytes], causal=False)
        # padded requests: empty mask segments
        self.mask_indptr[raw_bs + 1 : bs + 1] = self.mask_indptr[raw_bs]  # expect: FC104
        return w

    def verify_eager(self, fb: SpecForwardBatch, tree: DynamicTree) -> BatchPrefillWithPagedKVCacheWrapper:
        """Trees whose size has no recorded bucket: plan the eager wrapper with the tree's own mask."""
        cfg, (bs, ts) = self.cfg, tree.tokens.shape
        nnz = self._host_layout(fb, bs, ts)
        packed, _ = pack_tree_mask(tree.mask, fb.seq_lens_cpu[:bs].tolist())
        qo_indptr = torch.arange(bs + 1, dtype=torch.int32, device=self.device) * ts
        self.eager_verify.plan(qo_indptr, self.kv_indptr_host[: bs + 1], fb.kv_indices[:nnz],  # expect: FC102
                               self.last_page_len_host[:bs], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                               cfg.page_size, packed_custom_mask=packed, causal=False)
        return self.eager_verify
