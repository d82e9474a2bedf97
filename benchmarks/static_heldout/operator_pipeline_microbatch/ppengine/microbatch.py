"""Requests, micro-batches and their page tables: the host CSR plan() reads, the device CSR kernels read."""
from __future__ import annotations

import dataclasses
import itertools
import operator
from typing import List, Sequence, Tuple

import numpy as np
import torch

from .config import PAGE_SIZE, PipelineConfig


@dataclasses.dataclass
class RequestView:
    rid: int
    seq_len: int
    pages: List[int]
    new_token_ids: List[int]
    is_prefill: bool


def transpose_requests(reqs: Sequence[RequestView]) -> Tuple[list, list, list, list]:
    """[(rid, len, ids, prefill), ...] -> (rids, lens, ids, prefills): one list per field."""
    rows = map(operator.attrgetter("rid", "seq_len", "new_token_ids", "is_prefill"), reqs)
    rids, seq_lens, new_ids, prefill = map(list, zip(*rows))
    return rids, seq_lens, new_ids, prefill


def build_page_table_host(seq_lens: Sequence[int], pages: Sequence[List[int]]) -> Tuple[np.ndarray, ...]:
    assert len(seq_lens) == len(pages), "one page list per request"  # expect: FC109
    indptr = np.zeros(len(pages) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, pages), dtype=np.int32, count=len(pages)), out=indptr[1:])
    indices = np.fromiter(itertools.chain.from_iterable(pages), dtype=np.int32, count=int(indptr[-1]))  # ok: FC101
    return indptr, indices, (np.asarray(seq_lens, dtype=np.int32) - 1) % PAGE_SIZE + 1


def build_page_table(seq_lens: torch.Tensor, req_to_page: torch.Tensor, rows: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    dev, n = seq_lens.device, seq_lens.numel()
    num_pages = (seq_lens + PAGE_SIZE - 1) // PAGE_SIZE
    indptr = torch.zeros(n + 1, dtype=torch.int32, device=dev)
    indptr[1:] = torch.cumsum(num_pages, 0)
    total = int(indptr[-1])  # expect: FC101
    owner = torch.repeat_interleave(torch.arange(n, device=dev), num_pages, output_size=total)  # ok: FC101
    indices = req_to_page[rows[owner], torch.arange(total, device=dev) - indptr[owner].long()].int()
    return indptr, indices, (seq_lens - 1) % PAGE_SIZE + 1


@dataclasses.dataclass
class SlotBuffers:
    """Buffers of one micro-batch slot; every stage's graph wrappers of the slot are bound to them."""
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    hidden: torch.Tensor

    @classmethod
    def allocate(cls, cfg: PipelineConfig) -> "SlotBuffers":
        bs, dev, i32 = cfg.max_batch_per_mb, cfg.device, torch.int32
        return cls(torch.zeros(bs + 1, dtype=i32, device=dev), torch.zeros(cfg.max_pages, dtype=i32, device=dev),
                   torch.ones(bs, dtype=i32, device=dev), torch.zeros(bs + 1, dtype=i32, pin_memory=True),
                   torch.ones(bs, dtype=i32, pin_memory=True), torch.zeros(bs, cfg.hidden_size, dtype=torch.bfloat16, device=dev))

    def clear(self, n: int) -> None:
        self.kv_last_page_len[n:].fill_(1)  # expect: FC104


class MicroBatch:
    def __init__(self, slot: int, reqs: List[RequestView], device: str):
        assert reqs, "a micro-batch needs at least one request"  # expect: FC109
        self.slot, self.num_reqs = slot, len(reqs)
        rids, seq_lens, new_ids, prefill = transpose_requests(reqs)
        self.is_prefill = any(prefill)  # ok: FC101
        self.max_seq_len = max(seq_lens)  # ok: FC101
        self.indptr_h, self.indices_h, self.last_h = build_page_table_host(seq_lens, [r.pages for r in reqs])
        self.qo_indptr_cpu = torch.zeros(self.num_reqs + 1, dtype=torch.int32)
        self.qo_indptr_cpu[1:] = torch.tensor([len(ids) for ids in new_ids]).cumsum(0)
        self.num_tokens = int(self.qo_indptr_cpu[-1])  # ok: FC101
        self.no_prefix = self.num_tokens == sum(seq_lens)
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32).to(device, non_blocking=True)
        self.qo_indptr = self.qo_indptr_cpu.to(device, non_blocking=True)
        self.rows = torch.tensor(rids, dtype=torch.int64).to(device, non_blocking=True)
        self.input_ids = torch.tensor(list(itertools.chain(*new_ids)), dtype=torch.int64).to(device, non_blocking=True)
        pos = np.concatenate([np.arange(s - len(ids), s) for s, ids in zip(seq_lens, new_ids)])
        self.positions = torch.empty(len(pos), dtype=torch.int64, device=device)  # ok: FC107
        self.positions.copy_(torch.from_numpy(pos), non_blocking=True)
