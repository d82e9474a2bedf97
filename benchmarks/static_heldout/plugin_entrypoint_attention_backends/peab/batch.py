"""Per-step batch: device tensors for the kernels beside host mirrors for the planners."""
from __future__ import annotations

import dataclasses
from typing import List, Sequence

import numpy as np
import torch

from peab.config import PAGE_SIZE


@dataclasses.dataclass
class Request:
    rid: int
    token_ids: List[int]
    pages: List[int]
    num_computed: int
    num_new_tokens: int


@dataclasses.dataclass
class StepBatch:
    req_ids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_ids: torch.Tensor  # one KV slot per token
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    is_decode: bool
    batch_size: int
    shared_prefix_pages: int = 0

    @property
    def num_kv_pages(self) -> int:
        return int(self.kv_indptr[-1])  # expect: FC101

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens_cpu.max())  # ok: FC101


def build_step_batch(reqs: Sequence[Request], device: torch.device, shared_prefix_pages: int = 0) -> StepBatch:
    bs = len(reqs)
    q_lens = np.array([r.num_new_tokens for r in reqs], dtype=np.int32)
    kv_lens = np.array([r.num_computed + r.num_new_tokens for r in reqs], dtype=np.int32)
    pages = (kv_lens + PAGE_SIZE - 1) // PAGE_SIZE
    qo_indptr = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    kv_indices = np.concatenate([np.asarray(r.pages[:p], dtype=np.int32) for r, p in zip(reqs, pages)])
    last_page_len = (kv_lens - (pages - 1) * PAGE_SIZE).astype(np.int32)
    ids, positions, slots = (np.empty(int(qo_indptr[-1]), dtype=np.int64) for _ in range(3))  # ok: FC101
    for i, r in enumerate(reqs):
        lo, hi, pos = qo_indptr[i], qo_indptr[i + 1], np.arange(r.num_computed, r.num_computed + r.num_new_tokens)
        ids[lo:hi] = r.token_ids[r.num_computed : r.num_computed + r.num_new_tokens]
        positions[lo:hi] = pos
        slots[lo:hi] = np.asarray(r.pages, dtype=np.int64)[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE

    up = lambda a: torch.from_numpy(a).pin_memory().to(device, non_blocking=True)  # noqa: E731
    return StepBatch(
        req_ids=[r.rid for r in reqs], input_ids=up(ids), positions=up(positions), slot_ids=up(slots),
        seq_lens=up(kv_lens), seq_lens_cpu=torch.from_numpy(kv_lens),
        qo_indptr=up(qo_indptr), qo_indptr_cpu=torch.from_numpy(qo_indptr),
        kv_indptr=up(kv_indptr), kv_indptr_cpu=torch.from_numpy(kv_indptr), kv_indices=up(kv_indices),
        kv_last_page_len=up(last_page_len), kv_last_page_len_cpu=torch.from_numpy(last_page_len),
        is_decode=bool((q_lens == 1).all()), batch_size=bs, shared_prefix_pages=shared_prefix_pages)
