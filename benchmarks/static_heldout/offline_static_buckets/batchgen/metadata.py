"""Per-step metadata of a bucket's decode."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from batchgen.buckets import PackedBucket


@dataclass
class BucketMetadata:
    bs: int
    num_live: int
    kv_indptr_host: torch.Tensor         # pinned
    kv_last_page_len_host: torch.Tensor  # pinned
    kv_last_page_len: torch.Tensor       # device copy for the append kernel
    kv_indices: torch.Tensor             # device
    positions: torch.Tensor              # device
    live_rows: Optional[torch.Tensor] = None


class BucketMetadataBuilder:
    """Builds the decode metadata of the current bucket every step."""

    def __init__(self, max_bs: int, pages_per_row: int, page_size: int, device: torch.device):
        self.device = device
        self.page_size = page_size
        self.pages_per_row = pages_per_row
        self.seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.max_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.row_ids = torch.arange(max_bs, dtype=torch.int32, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.last_page_dev = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.seq_lens_np = np.zeros(max_bs, dtype=np.int32)
        self.indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.seq_lens_host = torch.zeros(max_bs, dtype=torch.int32)
        self.page_table: Optional[torch.Tensor] = None

    def start_bucket(self, bucket: PackedBucket, page_table: torch.Tensor) -> None:
        bs = bucket.spec.batch_size
        self.seq_lens_np[:bs] = 0
        self.seq_lens_np[: len(bucket.prompt_lens)] = bucket.prompt_lens
        self.seq_lens[:bs].copy_(torch.from_numpy(self.seq_lens_np[:bs]), non_blocking=True)
        self.max_lens[:bs] = bucket.spec.max_total_len
        self.page_table = page_table

    def build(self, bucket: PackedBucket, step: int) -> BucketMetadata:
        bs = bucket.spec.batch_size
        ps = self.page_size
        # host side: every row grows by one token per step (padding rows stay at length 0)
        live = self.seq_lens_np[:bs] > 0
        self.seq_lens_np[:bs][live] += 1  # ok: FC101
        pages = -(-self.seq_lens_np[:bs] // ps)
        self.indptr_pinned[0] = 0
        self.indptr_pinned[1 : bs + 1] = torch.from_numpy(np.cumsum(pages).astype(np.int32))
        self.last_page_pinned[:bs] = torch.from_numpy(np.where(live, (self.seq_lens_np[:bs] - 1) % ps + 1, 1).astype(np.int32))
        self.seq_lens_host = torch.zeros(bs, dtype=torch.int32)  # ok: FC107
        self.seq_lens[:bs] += 1
        self.positions = self.seq_lens[:bs].clone()  # expect: FC107
        max_kv = self.seq_lens[:bs].max().item()  # expect: FC101
        if max_kv > bucket.spec.max_total_len:
            raise RuntimeError(f"bucket overflow: {max_kv} > {bucket.spec.max_total_len}")
        live_rows = self.row_ids[:bs][self.seq_lens[:bs] < self.max_lens[:bs]]  # expect: FC101
        self.last_page_dev[:bs].copy_(self.last_page_pinned[:bs], non_blocking=True)
        nnz = int(self.indptr_pinned[bs])  # ok: FC101
        return BucketMetadata(
            bs=bs,
            num_live=bucket.num_live,
            kv_indptr_host=self.indptr_pinned,
            kv_last_page_len_host=self.last_page_pinned,
            kv_last_page_len=self.last_page_dev[:bs],
            kv_indices=self.page_table.view(-1)[:nnz],
            positions=self.positions,
            live_rows=live_rows,
        )
