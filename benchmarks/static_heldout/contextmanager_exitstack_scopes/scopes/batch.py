"""Per-step batches: device tensors for the kernels, pinned ``*_cpu`` mirrors for plan()."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
import torch


@dataclass
class DecodeBatch:
    req_slots: torch.Tensor
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    block_tables: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    num_reqs: int
    num_pages: int

    @classmethod
    def from_host(cls, slots: np.ndarray, ids: np.ndarray, seq_lens: np.ndarray, pages: List[np.ndarray],
                  page_size: int, device: torch.device) -> "DecodeBatch":
        indptr = np.concatenate([[0], np.cumsum([len(p) for p in pages])]).astype(np.int32)
        last = ((seq_lens - 1) % page_size + 1).astype(np.int32)
        table = np.zeros((len(pages), max(len(p) for p in pages)), dtype=np.int32)
        for row, p in enumerate(pages):
            table[row, : len(p)] = p
        return cls(
            req_slots=torch.from_numpy(slots).to(device), input_ids=torch.from_numpy(ids).to(device),
            seq_lens=torch.from_numpy(seq_lens).to(device),
            kv_indptr=torch.from_numpy(indptr).to(device), kv_indices=torch.from_numpy(np.concatenate(pages)).to(device),
            kv_last_page_len=torch.from_numpy(last).to(device), block_tables=torch.from_numpy(table).to(device),
            seq_lens_cpu=torch.from_numpy(seq_lens.astype(np.int32)).pin_memory(),
            kv_indptr_cpu=torch.from_numpy(indptr).pin_memory(), kv_last_page_len_cpu=torch.from_numpy(last).pin_memory(),
            num_reqs=len(pages), num_pages=int(indptr[-1]))


@dataclass
class ExtendBatch:
    input_ids: torch.Tensor
    req_slots: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    kv_indices: torch.Tensor
    extend_lens_cpu: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    num_reqs: int
    num_tokens: int
    fresh: bool = False

    @classmethod
    def from_host(cls, ids: np.ndarray, slots: np.ndarray, prefix_lens: np.ndarray, extend_lens: np.ndarray,
                  kv_indptr: np.ndarray, kv_indices: np.ndarray, last: np.ndarray, device: torch.device) -> "ExtendBatch":
        qo_indptr = np.concatenate([[0], np.cumsum(extend_lens)]).astype(np.int32)
        return cls(input_ids=torch.from_numpy(ids).to(device), req_slots=torch.from_numpy(slots).to(device),
                   prefix_lens=torch.from_numpy(prefix_lens).to(device), extend_lens=torch.from_numpy(extend_lens).to(device),
                   kv_indices=torch.from_numpy(kv_indices).to(device), extend_lens_cpu=torch.from_numpy(extend_lens),
                   qo_indptr_cpu=torch.from_numpy(qo_indptr), kv_indptr_cpu=torch.from_numpy(kv_indptr),
                   kv_last_page_len_cpu=torch.from_numpy(last), num_reqs=len(extend_lens),
                   num_tokens=int(qo_indptr[-1]), fresh=not prefix_lens.any())
