from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from cgt import DecodeBatch, ServingConfig


@dataclass
class DecodeMetadata:
    bucket: int
    num_reqs: int
    num_indices: int
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    max_seq_len: int


class DecodeMetadataBuilder:
    def __init__(self, cfg: ServingConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.kv_indices: Optional[torch.Tensor] = None
        self.indptr_pinned = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_pinned = torch.ones(cfg.max_batch, dtype=torch.int32, pin_memory=True)

    def build(self, batch: DecodeBatch, bucket: int) -> DecodeMetadata:
        bs = batch.size
        if bs > bucket:
            raise ValueError(f"batch of {bs} does not fit bucket {bucket}: {batch.seq_lens}")  # ok: FC101
        page = self.cfg.page_size
        lens_np = batch.seq_lens_cpu.numpy()
        pages_np = (lens_np + page - 1) // page
        indptr_cpu = self.indptr_pinned[: bucket + 1]
        indptr_cpu.zero_()
        indptr_cpu[1 : bs + 1] = torch.from_numpy(np.cumsum(pages_np, dtype=np.int32))
        indptr_cpu[bs + 1 :] = indptr_cpu[bs]
        total = int(indptr_cpu[bucket])  # ok: FC101
        last_cpu = self.last_page_pinned[:bucket]
        last_cpu.fill_(1)
        last_cpu[:bs] = torch.from_numpy(((lens_np - 1) % page + 1).astype(np.int32))

        if self.kv_indices is None or self.kv_indices.numel() < total:
            self.kv_indices = torch.empty(max(total, 4096), dtype=torch.int32, device=self.device)  # expect: FC107
        flat = np.concatenate([batch.page_table_cpu[i, : pages_np[i]] for i in range(bs)])
        self.kv_indices[:total].copy_(torch.from_numpy(flat), non_blocking=True)
        row_valid = torch.arange(bucket, device=self.device) < bs
        padded = torch.nn.functional.pad(batch.seq_lens, (0, bucket - bs), value=1)
        seq_lens = torch.where(row_valid, padded, torch.ones_like(padded))  # ok: FC101
        # trtllm-gen overflow decode wants the longest row
        max_len = int(batch.seq_lens.max())  # expect: FC101
        tables = np.zeros((bucket, batch.page_table_cpu.shape[1]), dtype=np.int32)
        tables[:bs] = batch.page_table_cpu
        return DecodeMetadata(
            bucket=bucket, num_reqs=bs, num_indices=total, kv_indptr=indptr_cpu.to(self.device, non_blocking=True),
            kv_indptr_cpu=indptr_cpu, kv_indices=self.kv_indices[:total], kv_last_page_len_cpu=last_cpu,
            seq_lens=seq_lens, block_tables=torch.from_numpy(tables).to(self.device, non_blocking=True),
            max_seq_len=max_len)

    def dummy(self, bucket: int) -> DecodeMetadata:
        indptr_cpu = torch.arange(bucket + 1, dtype=torch.int32)
        return DecodeMetadata(
            bucket, bucket, bucket, indptr_cpu.to(self.device), indptr_cpu,
            torch.zeros(bucket, dtype=torch.int32, device=self.device), torch.ones(bucket, dtype=torch.int32),
            torch.ones(bucket, dtype=torch.int32, device=self.device),
            torch.zeros(bucket, self.cfg.max_pages_per_seq, dtype=torch.int32, device=self.device), 1)
