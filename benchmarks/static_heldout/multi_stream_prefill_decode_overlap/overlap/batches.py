from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch


@dataclass
class PrefillBatch:
    request_ids: List[int]
    tokens: torch.Tensor
    positions: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor
    kv_lens: torch.Tensor


@dataclass
class DecodeBatch:
    tokens: torch.Tensor
    positions: torch.Tensor
    seq_lens_cpu: torch.Tensor
    indptr_np: np.ndarray
    indices_np: np.ndarray
    last_np: np.ndarray

    @property
    def batch_size(self) -> int:
        return int(self.last_np.shape[0])


@dataclass
class Admission:
    request_id: int
    row_offset: int
    pages_np: np.ndarray


@dataclass
class StepPlan:
    prefill: Optional[PrefillBatch] = None
    decode: Optional[DecodeBatch] = None
    admitted: List[Admission] = field(default_factory=list)


def make_prefill_batch(request_ids, token_lists, prefix_lens, page_tables, page_size, device) -> PrefillBatch:
    q_lens = np.asarray([len(t) for t in token_lists], dtype=np.int32)
    kv_lens = np.asarray(prefix_lens, dtype=np.int32) + q_lens
    pages = (kv_lens + page_size - 1) // page_size
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    kv = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = np.concatenate([np.asarray(t[:n], dtype=np.int32) for t, n in zip(page_tables, pages)])
    positions = np.concatenate([np.arange(p, p + q) for p, q in zip(prefix_lens, q_lens)])
    return PrefillBatch(
        request_ids=list(request_ids),
        tokens=torch.from_numpy(np.concatenate(token_lists).astype(np.int64)).to(device, non_blocking=True),
        positions=torch.from_numpy(positions.astype(np.int64)).to(device, non_blocking=True),
        qo_indptr_cpu=torch.from_numpy(qo),
        kv_indptr_cpu=torch.from_numpy(kv),
        kv_indices_cpu=torch.from_numpy(indices),
        last_page_len_cpu=torch.from_numpy((kv_lens - (pages - 1) * page_size).astype(np.int32)),
        kv_lens=torch.from_numpy(kv_lens).to(device, non_blocking=True),
    )


def make_decode_batch(tokens, seq_lens, page_tables, page_size, device) -> DecodeBatch:
    seq_np = np.asarray(seq_lens, dtype=np.int32)
    pages = (seq_np + page_size - 1) // page_size
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = np.concatenate([np.asarray(t[:n], dtype=np.int32) for t, n in zip(page_tables, pages)])
    return DecodeBatch(
        tokens=torch.as_tensor(tokens, dtype=torch.int64, device=device),
        positions=torch.from_numpy(seq_np.astype(np.int64) - 1).to(device, non_blocking=True),
        seq_lens_cpu=torch.from_numpy(seq_np),
        indptr_np=indptr,
        indices_np=indices,
        last_np=(seq_np - (pages - 1) * page_size).astype(np.int32),
    )
