"""Per-step batches, built on the host with numpy and staged through pinned memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np
import torch

from loraslots.kvpool import PagePool


@dataclass
class Request:
    rid: int
    adapter_id: int  # -1: base model only
    prompt: List[int]
    max_new_tokens: int
    cache_slot: int = -1  # row of the engine's last-token buffer
    slot: int = 0  # adapter slot the request gathers from
    row: int = -1  # row in the last decode batch
    generated: int = 0


@dataclass
class DecodeBatch:
    req_ids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_ids: torch.Tensor
    out_loc: torch.Tensor
    cache_slots: torch.Tensor
    lora_mask_dev: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_host: torch.Tensor
    block_table_host: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.req_ids)


@dataclass
class PrefillBatch:
    req_ids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_ids: torch.Tensor
    out_loc: torch.Tensor
    cache_slots: torch.Tensor
    qo_indptr_host: torch.Tensor
    last_token_rows: torch.Tensor


def _pinned(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).pin_memory()


def _to_dev(a: np.ndarray, device: torch.device) -> torch.Tensor:
    return _pinned(a).to(device, non_blocking=True)


def build_decode_batch(
    reqs: Sequence[Request], pool: PagePool, last_ids: torch.Tensor, device: torch.device, pages_per_seq: int
) -> DecodeBatch:
    n = len(reqs)
    seq = np.array([pool.lens[r.rid] for r in reqs], dtype=np.int32)
    pages = [pool.pages[r.rid] for r in reqs]
    counts = np.array([len(p) for p in pages], dtype=np.int32)
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    flat = np.concatenate([np.asarray(p, dtype=np.int32) for p in pages]) if n else np.zeros(0, np.int32)
    last = ((seq - 1) % pool.page_size + 1).astype(np.int32)
    out_loc = np.array([p[-1] * pool.page_size + (s - 1) % pool.page_size for p, s in zip(pages, seq)], np.int64)
    table = np.zeros((n, pages_per_seq), dtype=np.int32)
    for i, p in enumerate(pages):
        table[i, : len(p)] = p
    cache_slots = _to_dev(np.array([r.cache_slot for r in reqs], dtype=np.int64), device)
    slot_ids = _to_dev(np.array([r.slot for r in reqs], dtype=np.int64), device)
    return DecodeBatch(
        req_ids=[r.rid for r in reqs],
        input_ids=last_ids.index_select(0, cache_slots),
        positions=_to_dev((seq - 1).astype(np.int64), device),
        slot_ids=slot_ids,
        out_loc=_to_dev(out_loc, device),
        cache_slots=cache_slots,
        lora_mask_dev=slot_ids > 0,
        seq_lens_cpu=_pinned(seq),
        kv_indptr_host=_pinned(indptr),
        kv_indices=_to_dev(flat, device),
        kv_last_page_host=_pinned(last),
        block_table_host=_pinned(table),
    )


def build_prefill_batch(reqs: Sequence[Request], pool: PagePool, device: torch.device) -> PrefillBatch:
    lens = np.array([len(r.prompt) for r in reqs], dtype=np.int32)
    qo_indptr = np.zeros(len(reqs) + 1, dtype=np.int32)
    np.cumsum(lens, out=qo_indptr[1:])
    ids = np.concatenate([np.asarray(r.prompt, dtype=np.int64) for r in reqs])
    pos = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
    slots = np.repeat(np.array([r.slot for r in reqs], dtype=np.int64), lens)
    out_loc = np.concatenate([np.asarray(pool.token_slots(r.rid), dtype=np.int64) for r in reqs])
    return PrefillBatch(
        req_ids=[r.rid for r in reqs],
        input_ids=_to_dev(ids, device),
        positions=_to_dev(pos, device),
        slot_ids=_to_dev(slots, device),
        out_loc=_to_dev(out_loc, device),
        cache_slots=_to_dev(np.array([r.cache_slot for r in reqs], dtype=np.int64), device),
        qo_indptr_host=_pinned(qo_indptr),
        last_token_rows=_to_dev((qo_indptr[1:] - 1).astype(np.int64), device),
    )


def dummy_decode_batch(
    bs: int,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    slot_ids: torch.Tensor,
    out_loc: torch.Tensor,
    page_size: int,
) -> DecodeBatch:
    """A capture batch: every row holds one token on the null page and gathers the zero slot."""
    indptr = np.arange(bs + 1, dtype=np.int32)
    return DecodeBatch(
        req_ids=list(range(bs)),
        input_ids=input_ids[:bs],
        positions=positions[:bs],
        slot_ids=slot_ids[:bs],
        out_loc=out_loc[:bs],
        cache_slots=slot_ids[:bs],
        lora_mask_dev=slot_ids[:bs] > 0,
        seq_lens_cpu=_pinned(np.ones(bs, dtype=np.int32)),
        kv_indptr_host=_pinned(indptr),
        kv_indices=torch.zeros(bs, dtype=torch.int32, device=input_ids.device),
        kv_last_page_host=_pinned(np.ones(bs, dtype=np.int32)),
        block_table_host=_pinned(np.zeros((bs, 1), dtype=np.int32)),
    )
