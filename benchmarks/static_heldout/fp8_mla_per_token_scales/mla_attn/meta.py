from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
import torch

from mla_fp8 import MLAConfig


@dataclass
class MLADecodeMeta:
    num_seqs: int
    q_len: int  # > 1 when verifying speculative tokens
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor


def build_decode_meta(
    seq_lens_cpu: torch.Tensor, page_lists: List[List[int]], q_len: int, cfg: MLAConfig, device: torch.device
) -> MLADecodeMeta:
    n = len(page_lists)
    npages = np.fromiter(map(len, page_lists), dtype=np.int32, count=n)
    kv_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
    np.cumsum(npages, out=kv_indptr_cpu.numpy()[1:])
    table = np.zeros((n, cfg.max_pages_per_seq), dtype=np.int32)
    for i, pages in enumerate(page_lists):
        table[i, : len(pages)] = pages
    flat = np.concatenate([np.asarray(p, dtype=np.int32) for p in page_lists])
    return MLADecodeMeta(
        num_seqs=n,
        q_len=q_len,
        kv_indptr_cpu=kv_indptr_cpu,
        kv_indices=torch.from_numpy(flat).pin_memory().to(device, non_blocking=True),
        seq_lens_cpu=seq_lens_cpu,
        seq_lens=seq_lens_cpu.to(device, non_blocking=True),
        block_tables=torch.from_numpy(table).pin_memory().to(device, non_blocking=True),
    )
