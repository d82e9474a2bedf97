"""Target-model verification of a whole draft tree with one custom-mask paged prefill."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from treespec.config import SpecConfig


@dataclass
class TreeBatch:
    bs: int
    num_nodes: int
    mask_len: int
    qo_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    positions: torch.Tensor
    slot_pages: torch.Tensor
    slot_offsets: torch.Tensor


class VerifyBackend:
    VERIFY_WS = 96 * 1024 * 1024

    def __init__(self, cfg: SpecConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.workspace = torch.empty(self.VERIFY_WS, dtype=torch.uint8, device=device)  # expect: FC106
        self.wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "HND")
        # flattened bool mask of every request's [q_len, kv_len] block, filled from a pinned mirror
        self.mask_buf = torch.zeros(cfg.max_mask_bits(), dtype=torch.bool, device=device)
        self.mask_pinned = torch.zeros(cfg.max_mask_bits(), dtype=torch.bool, pin_memory=True)

    def _check_workspace(self, batch: TreeBatch) -> None:
        cfg = self.cfg
        need = batch.num_nodes * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 2
        if self.wrapper._float_workspace_buffer.numel() < need:  # expect: FC103
            raise RuntimeError(f"verify workspace too small for {batch.num_nodes} tree nodes ({need} bytes)")

    def plan_verify(self, batch: TreeBatch) -> None:
        cfg = self.cfg
        self._check_workspace(batch)
        self.wrapper.plan(  # expect: FC102
            batch.qo_indptr,
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            custom_mask=self.mask_buf[: batch.mask_len],
            sm_scale=cfg.sm_scale,
            q_data_type=cfg.dtype,
        )

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.wrapper.run(q, kv_cache)
