"""Per-step decode metadata of the FP4 engine."""

from dataclasses import dataclass
from typing import List

import numpy as np
import torch

from fp4kv import FP4Config, FP4PageCache

from .paging import last_page_lens, page_counts


@dataclass
class DecodeBatch:
    req_ids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor          # device, int32
    seq_lens_cpu: torch.Tensor      # host copy the scheduler built it from
    page_table_np: np.ndarray       # [bs, max_pages_per_seq] FP4 page ids
    sink_pages_np: np.ndarray       # [bs] bf16 sink page of each request

    @property
    def batch_size(self) -> int:
        return len(self.req_ids)


@dataclass
class DecodeMeta:
    batch_size: int
    num_pages: int
    max_seq_len: int
    seq_lens: torch.Tensor           # device
    kv_indptr: torch.Tensor          # device: eager dequant decode
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor         # device: FP4 page ids, row-major
    last_page_len: torch.Tensor      # device
    last_page_len_cpu: torch.Tensor
    block_tables: torch.Tensor       # device: native FP4 (trtllm-gen) path
    sink_indptr_cpu: torch.Tensor
    sink_indices: torch.Tensor
    sink_last_page_len_cpu: torch.Tensor


class FP4MetadataBuilder:
    def __init__(self, cfg: FP4Config, cache: FP4PageCache, device):
        self.cfg = cfg
        self.cache = cache
        self.device = device
        self.page_size = cfg.page_size

    def build(self, batch: DecodeBatch) -> DecodeMeta:
        bs = batch.batch_size
        max_len = int(batch.seq_lens_cpu.max())  # ok: FC101
        num_pages = self.cache.pages_for(batch.seq_lens)
        counts_np = page_counts(batch.seq_lens_cpu, self.page_size).numpy()
        pages_per_req = counts_np.tolist()  # ok: FC101
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        kv_indptr_cpu[1:] = torch.from_numpy(np.cumsum(counts_np)).to(torch.int32)
        flat_np = np.concatenate([batch.page_table_np[i, :n] for i, n in enumerate(pages_per_req)])
        kv_indices = torch.from_numpy(flat_np).to(self.device, non_blocking=True)
        kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(page_counts(batch.seq_lens, self.page_size), 0, out=kv_indptr[1:])
        sink_indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        sink_last_cpu = torch.clamp(batch.seq_lens_cpu, max=self.page_size).to(torch.int32)
        return DecodeMeta(
            batch_size=bs,
            num_pages=num_pages,
            max_seq_len=max_len,
            seq_lens=batch.seq_lens,
            kv_indptr=kv_indptr,
            kv_indptr_cpu=kv_indptr_cpu,
            kv_indices=kv_indices,
            last_page_len=last_page_lens(batch.seq_lens, self.page_size),
            last_page_len_cpu=last_page_lens(batch.seq_lens_cpu, self.page_size),
            block_tables=torch.from_numpy(batch.page_table_np).to(self.device, non_blocking=True),
            sink_indptr_cpu=sink_indptr_cpu,
            sink_indices=torch.from_numpy(batch.sink_pages_np).to(self.device, non_blocking=True),
            sink_last_page_len_cpu=sink_last_cpu,
        )
