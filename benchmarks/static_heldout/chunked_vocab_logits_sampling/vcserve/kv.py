"""Paged KV with attention sinks: every request keeps its first page and a window of recent pages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from vocabchunk.settings import ChunkSettings

NULL_PAGE = 0


@dataclass
class Request:
    rid: int
    prompt: List[int]
    params: object
    cache_slot: int = -1
    generated: int = 0


@dataclass
class DecodeBatch:
    req_ids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_loc: torch.Tensor
    cache_slots: torch.Tensor
    pages_per_req: torch.Tensor  # device: window pages per row
    seq_lens_cpu: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_host: torch.Tensor
    first_pages_np: np.ndarray
    num_pages_host: int
    block_table_host: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.req_ids)


class SinkPagePool:
    def __init__(self, s: ChunkSettings, device: torch.device) -> None:
        self.page_size = s.page_size
        self.window_pages = s.window_pages
        self.kv_heads, self.head_dim = s.num_kv_heads, s.head_dim
        shape = (s.max_pages, s.page_size, s.num_kv_heads, s.head_dim)
        self.k = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(s.num_layers)]
        self.v = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(s.num_layers)]
        self._free: List[int] = list(range(s.max_pages - 1, NULL_PAGE, -1))
        self.sink: Dict[int, int] = {}
        self.window: Dict[int, List[int]] = {}
        self.lens: Dict[int, int] = {}

    def kv(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer], self.v[layer]

    def admit(self, rid: int, n: int) -> List[int]:
        pages = [self._free.pop() for _ in range((n + self.page_size - 1) // self.page_size)]
        self.sink[rid] = pages[0]
        self.window[rid] = pages[1:]
        self.lens[rid] = n
        return pages

    def grow(self, rid: int) -> int:
        n = self.lens[rid]
        if n % self.page_size == 0:
            self.window[rid].append(self._free.pop())
            if len(self.window[rid]) > self.window_pages:
                self._free.append(self.window[rid].pop(0))
        self.lens[rid] = n + 1
        last = self.window[rid][-1] if self.window[rid] else self.sink[rid]
        return last * self.page_size + n % self.page_size

    def release(self, rid: int) -> None:
        self._free.append(self.sink.pop(rid))
        self._free.extend(self.window.pop(rid))
        self.lens.pop(rid)

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        self.k[layer].view(-1, self.kv_heads, self.head_dim).index_copy_(0, out_loc, k)
        self.v[layer].view(-1, self.kv_heads, self.head_dim).index_copy_(0, out_loc, v)


def _pinned(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).pin_memory()


def build_decode_batch(
    reqs: Sequence[Request], pool: SinkPagePool, last_ids: torch.Tensor, device: torch.device
) -> DecodeBatch:
    n = len(reqs)
    windows = [pool.window[r.rid] for r in reqs]
    counts = np.array([len(w) for w in windows], dtype=np.int32)
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    flat = np.concatenate([np.asarray(w, np.int32) for w in windows]) if n else np.zeros(0, np.int32)
    seq = np.array([pool.lens[r.rid] for r in reqs], dtype=np.int32)
    last = ((seq - 1) % pool.page_size + 1).astype(np.int32)
    out_loc = np.array([(w[-1] if w else pool.sink[r.rid]) * pool.page_size + (s - 1) % pool.page_size
                        for r, w, s in zip(reqs, windows, seq)], dtype=np.int64)
    table = np.zeros((n, pool.window_pages + 1), dtype=np.int32)
    for i, (r, w) in enumerate(zip(reqs, windows)):
        table[i, 0] = pool.sink[r.rid]
        table[i, 1 : 1 + len(w)] = w
    cache_slots = _pinned(np.array([r.cache_slot for r in reqs], np.int64)).to(device, non_blocking=True)
    return DecodeBatch(
        req_ids=[r.rid for r in reqs],
        input_ids=last_ids.index_select(0, cache_slots),
        positions=_pinned((seq - 1).astype(np.int64)).to(device, non_blocking=True),
        out_loc=_pinned(out_loc).to(device, non_blocking=True),
        cache_slots=cache_slots,
        pages_per_req=_pinned(counts).to(device, non_blocking=True),
        seq_lens_cpu=_pinned(seq),
        kv_indptr_host=_pinned(indptr),
        kv_indices=_pinned(flat).to(device, non_blocking=True),
        kv_last_page_host=_pinned(last),
        first_pages_np=np.array([pool.sink[r.rid] for r in reqs], dtype=np.int32),
        num_pages_host=int(indptr[-1]),
        block_table_host=_pinned(table),
    )


def dummy_decode_batch(bs: int, input_ids, positions, out_loc, cache_slots) -> DecodeBatch:
    ones = np.ones(bs, dtype=np.int32)
    return DecodeBatch(
        req_ids=list(range(bs)),
        input_ids=input_ids[:bs],
        positions=positions[:bs],
        out_loc=out_loc[:bs],
        cache_slots=cache_slots[:bs],
        pages_per_req=torch.ones(bs, dtype=torch.int32, device=input_ids.device),
        seq_lens_cpu=_pinned(ones),
        kv_indptr_host=_pinned(np.arange(bs + 1, dtype=np.int32)),
        kv_indices=torch.zeros(bs, dtype=torch.int32, device=input_ids.device),
        kv_last_page_host=_pinned(ones),
        first_pages_np=np.zeros(bs, dtype=np.int32),
        num_pages_host=bs,
        block_table_host=_pinned(np.zeros((bs, 2), dtype=np.int32)),
    )
