"""Scheduled batches and their split into pipeline microbatches (built on the host with numpy)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence

import numpy as np
import torch


@dataclass
class Request:
    req_id: int
    prompt_len: int
    num_computed: int  # tokens whose KV is already in the cache
    num_new: int  # tokens scheduled this step
    page_ids: List[int] = field(default_factory=list)
    token_offset: int = 0  # where this request's tokens start in the step's flat id array

    @property
    def is_prefill(self) -> bool:
        return self.num_computed < self.prompt_len

    @property
    def kv_len(self) -> int:
        return self.num_computed + self.num_new


@dataclass
class ScheduledBatch:
    step: int
    requests: List[Request]
    input_ids_np: np.ndarray  # every scheduled token of the step, request after request
    page_size: int


@dataclass
class Microbatch:
    mb_id: int
    req_ids: List[int]
    is_prefill: bool
    num_tokens: int
    # pinned host mirrors
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    # device copies
    input_ids: torch.Tensor
    positions: torch.Tensor
    qo_indptr: torch.Tensor
    q_lens: torch.Tensor
    seq_lens: torch.Tensor
    kv_indices: torch.Tensor
    block_tables: torch.Tensor
    slot_pages: torch.Tensor
    slot_offsets: torch.Tensor

    @property
    def bs(self) -> int:
        return len(self.req_ids)


def _pinned(arr: np.ndarray, dtype=np.int32) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=dtype)).pin_memory()


def _build_one(mb_id: int, reqs: Sequence[Request], ids_np: np.ndarray, page_size: int,
               device: torch.device) -> Microbatch:
    bs = len(reqs)
    q_lens = np.array([r.num_new for r in reqs], dtype=np.int32)
    kv_lens = np.array([r.kv_len for r in reqs], dtype=np.int32)
    pages_per = (kv_lens + page_size - 1) // page_size

    qo_indptr = np.zeros(bs + 1, dtype=np.int32)
    np.cumsum(q_lens, out=qo_indptr[1:])
    kv_indptr = np.zeros(bs + 1, dtype=np.int32)
    np.cumsum(pages_per, out=kv_indptr[1:])
    kv_indices = np.concatenate(
        [np.asarray(r.page_ids[:n], dtype=np.int32) for r, n in zip(reqs, pages_per)]
    )
    last_page_len = (kv_lens - 1) % page_size + 1

    width = int(pages_per.max())
    block_tables = np.zeros((bs, width), dtype=np.int32)
    for i, (r, n) in enumerate(zip(reqs, pages_per)):
        block_tables[i, :n] = r.page_ids[:n]

    positions = np.concatenate([np.arange(r.num_computed, r.kv_len, dtype=np.int64) for r in reqs])
    rows = np.repeat(np.arange(bs), q_lens)
    slot_pages = block_tables[rows, positions // page_size]
    slot_offsets = positions % page_size
    ids = np.concatenate([ids_np[r.token_offset: r.token_offset + r.num_new] for r in reqs])

    qo_cpu = _pinned(qo_indptr)
    seq_lens_cpu = _pinned(kv_lens)
    return Microbatch(
        mb_id=mb_id,
        req_ids=[r.req_id for r in reqs],
        is_prefill=reqs[0].is_prefill,
        num_tokens=int(qo_indptr[-1]),
        qo_indptr_cpu=qo_cpu,
        kv_indptr_cpu=_pinned(kv_indptr),
        kv_last_page_len_cpu=_pinned(last_page_len),
        seq_lens_cpu=seq_lens_cpu,
        input_ids=_pinned(ids, np.int64).to(device, non_blocking=True),
        positions=_pinned(positions, np.int64).to(device, non_blocking=True),
        qo_indptr=qo_cpu.to(device, non_blocking=True),
        q_lens=_pinned(q_lens).to(device, non_blocking=True),
        seq_lens=seq_lens_cpu.to(device, non_blocking=True),
        kv_indices=_pinned(kv_indices).to(device, non_blocking=True),
        block_tables=_pinned(block_tables).to(device, non_blocking=True),
        slot_pages=_pinned(slot_pages, np.int64).to(device, non_blocking=True),
        slot_offsets=_pinned(slot_offsets, np.int64).to(device, non_blocking=True),
    )


def split_batch(batch: ScheduledBatch, num_microbatches: int, device: torch.device) -> List[Microbatch]:
    """Prefill requests travel in microbatches of their own; decode requests are dealt round robin."""
    assert num_microbatches <= len(batch.requests)  # expect: FC109
    prefill = [r for r in batch.requests if r.is_prefill]
    decode = [r for r in batch.requests if not r.is_prefill]
    groups: List[List[Request]] = []
    if prefill:
        groups.append(prefill)
    n_decode_groups = max(1, num_microbatches - len(groups))
    if decode:
        dealt: List[List[Request]] = [[] for _ in range(min(n_decode_groups, len(decode)))]
        for i, r in enumerate(decode):
            dealt[i % len(dealt)].append(r)
        groups.extend(dealt)
    return [
        _build_one(mb_id, reqs, batch.input_ids_np, batch.page_size, device)
        for mb_id, reqs in enumerate(groups)
    ]
