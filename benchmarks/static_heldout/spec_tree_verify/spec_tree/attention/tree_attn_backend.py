"""Tree-verification attention: one prefill over all draft nodes with a custom mask, graph-mode per batch size."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict

import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from spec_tree.config import SpecConfig
from spec_tree.tree import TreeSpec

logger = logging.getLogger(__name__)

VERIFY_WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass
class VerifyBatch:
    bs: int
    seq_lens_cpu: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_indices: torch.Tensor
    num_kv_pages_cpu: np.ndarray
    tree: TreeSpec


class TreeAttnBackend:
    def __init__(self, cfg: SpecConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self.num_nodes = cfg.tree.num_nodes
        self.workspace_buffer = torch.empty(VERIFY_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106  # ok: FC105
        self.init_verify_buffers(cfg.max_batch_size)
        self.graph_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {}
        self.eager_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, "NHD", backend="fa3")

    def init_verify_buffers(self, max_bs: int) -> None:
        n = self.num_nodes
        self.qo_indptr = torch.arange(0, (max_bs + 1) * n, n, dtype=torch.int32, device=self.device)
        self.qo_indptr_cpu = torch.arange(0, (max_bs + 1) * n, n, dtype=torch.int32)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(max_bs * self.cfg.max_pages_per_req, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.kv_last_page_len.fill_(1)  # ok: FC104
        mask_bytes = max_bs * n * (n + self.cfg.max_context_len)
        self.custom_mask = torch.zeros(mask_bytes // 8 + 1, dtype=torch.uint8, device=self.device)
        self.mask_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)

    def get_graph_wrapper(self, bs: int) -> BatchPrefillWithPagedKVCacheWrapper:
        wrapper = self.graph_wrappers.get(bs)
        if wrapper is None:
            wrapper = BatchPrefillWithPagedKVCacheWrapper(
                self.workspace_buffer,
                "NHD",
                use_cuda_graph=True,
                qo_indptr_buf=self.qo_indptr[: bs + 1],
                paged_kv_indptr_buf=self.kv_indptr[: bs + 1],
                paged_kv_indices_buf=self.kv_indices,
                paged_kv_last_page_len_buf=self.kv_last_page_len[:bs],
                custom_mask_buf=self.custom_mask,
                mask_indptr_buf=self.mask_indptr[: bs + 1],
                backend="fa3",
            )
            self.graph_wrappers[bs] = wrapper
        return wrapper

    def prepare_verify(self, batch: VerifyBatch, use_graph: bool) -> BatchPrefillWithPagedKVCacheWrapper:
        bs = batch.bs
        tree = batch.tree
        if tree.num_nodes != self.num_nodes:
            # dynamic trees: the mask buffer follows the node count
            self.num_nodes = tree.num_nodes
            self.custom_mask = torch.zeros(self.custom_mask.numel() * 2, dtype=torch.uint8, device=self.device)  # expect: FC107
        kv_indptr_np = self.kv_indptr_cpu.numpy()
        np.cumsum(batch.num_kv_pages_cpu[:bs], out=kv_indptr_np[1 : bs + 1])
        total_pages = int(kv_indptr_np[bs])  # ok: FC101
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:total_pages].copy_(batch.kv_indices[:total_pages], non_blocking=True)  # ok: FC104
        mask = tree.full_mask(batch.seq_lens_cpu[:bs])
        wrapper = self.get_graph_wrapper(bs) if use_graph else self.eager_wrapper
        wrapper.plan(  # expect: FC102
            self.qo_indptr_cpu[: bs + 1],
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices[:total_pages],
            batch.kv_last_page_len,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.page_size,
            custom_mask=mask,
            q_data_type=self.cfg.dtype,
        )
        if use_graph:
            # an unpacked copy for the draft-token gather kernel
            self.custom_mask[: mask.numel()].copy_(mask.to(torch.uint8), non_blocking=True)  # expect: FC104
        return wrapper
