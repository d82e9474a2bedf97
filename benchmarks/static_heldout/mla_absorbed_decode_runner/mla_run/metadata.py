from dataclasses import dataclass
from typing import List

import numpy as np
import torch

from mlaserve import MLAConfig


@dataclass
class MLADecodeMeta:
    batch_size: int
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_lens_cpu: torch.Tensor
    kv_lens: torch.Tensor
    block_tables: torch.Tensor
    positions: torch.Tensor


@dataclass
class MLAPrefillMeta:
    num_tokens: int
    cu_seqlens_cpu: torch.Tensor
    cu_seqlens_kv_cpu: torch.Tensor
    positions: torch.Tensor


def make_decode_meta(page_lists: List[List[int]], seq_lens: List[int], cfg: MLAConfig,
                     device: torch.device) -> MLADecodeMeta:
    bs = len(seq_lens)
    counts = np.array([len(p) for p in page_lists], dtype=np.int32)
    kv_indptr = np.zeros(bs + 1, dtype=np.int32)
    np.cumsum(counts, out=kv_indptr[1:])
    lens = np.asarray(seq_lens, dtype=np.int32)
    flat = np.concatenate([np.asarray(p, dtype=np.int32) for p in page_lists]) if bs else np.zeros(0, np.int32)
    tables = np.zeros((bs, max(1, int(counts.max()) if bs else 1)), dtype=np.int32)
    for i, p in enumerate(page_lists):
        tables[i, : len(p)] = p
    return MLADecodeMeta(
        batch_size=bs,
        qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32).pin_memory(),
        kv_indptr_cpu=torch.from_numpy(kv_indptr).pin_memory(),
        kv_indices=torch.from_numpy(flat).to(device, non_blocking=True),
        kv_lens_cpu=torch.from_numpy(lens).pin_memory(),
        kv_lens=torch.from_numpy(lens).to(device, non_blocking=True),
        block_tables=torch.from_numpy(tables).to(device, non_blocking=True),
        positions=torch.from_numpy(lens - 1).long().to(device, non_blocking=True),
    )
