"""Per-step attention metadata, built on the host into pinned staging buffers."""

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from fp8kv.config import Fp8ServeConfig


@dataclass
class DecodeBatch:
    """Host description of one decode step: lengths include the token being decoded."""

    input_ids: List[int]
    seq_lens: List[int]
    page_lists: List[np.ndarray]


@dataclass
class PrefillBatch:
    prompt_ids: List[List[int]]
    page_lists: List[np.ndarray]
    cached_lens: List[int] = field(default_factory=list)


@dataclass
class DecodeMeta:
    batch_size: int
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    max_seq_len: int
    graph_bs: Optional[int] = None


@dataclass
class PrefillMeta:
    num_tokens: int
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    slot_mapping: torch.Tensor
    positions: torch.Tensor


@dataclass
class GraphBuffers:
    """Buffers bound to the captured decode wrappers (device) and their pinned mirrors."""

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor


class PinnedStaging:
    def __init__(self, cfg: Fp8ServeConfig):
        n = cfg.max_batch_size
        self.kv_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)


def _to_device(host: np.ndarray, device, dtype=torch.int32) -> torch.Tensor:
    return torch.from_numpy(host).to(dtype).pin_memory().to(device, non_blocking=True)


def build_decode_meta(batch: DecodeBatch, cfg: Fp8ServeConfig, staging: PinnedStaging, device) -> DecodeMeta:
    page = cfg.page_size
    bs = len(batch.seq_lens)
    lens = np.asarray(batch.seq_lens, dtype=np.int32)
    n_pages = (lens + page - 1) // page
    indptr = staging.kv_indptr_cpu.numpy()
    indptr[0] = 0
    np.cumsum(n_pages, out=indptr[1 : bs + 1])
    last = staging.last_page_len_cpu.numpy()
    last[:bs] = lens - (n_pages - 1) * page
    indices = np.concatenate([pl[:n] for pl, n in zip(batch.page_lists, n_pages)])
    width = int(n_pages.max())
    tables = np.zeros((bs, width), dtype=np.int32)
    for row, (pl, n) in enumerate(zip(batch.page_lists, n_pages)):
        tables[row, :n] = pl[:n]
    pos = lens - 1
    slots = np.array([pl[p // page] * page + p % page for pl, p in zip(batch.page_lists, pos)], dtype=np.int64)
    return DecodeMeta(
        batch_size=bs,
        kv_indptr_cpu=staging.kv_indptr_cpu[: bs + 1],
        kv_indices=_to_device(indices, device),
        last_page_len_cpu=staging.last_page_len_cpu[:bs],
        seq_lens=_to_device(lens, device),
        block_tables=_to_device(tables, device),
        slot_mapping=_to_device(slots, device, torch.int64),
        max_seq_len=int(lens.max()),
    )


def build_prefill_meta(batch: PrefillBatch, cfg: Fp8ServeConfig, device) -> PrefillMeta:
    page = cfg.page_size
    q_lens = np.array([len(p) for p in batch.prompt_ids], dtype=np.int32)
    cached = np.asarray(batch.cached_lens or [0] * len(q_lens), dtype=np.int32)
    kv_lens = cached + q_lens
    n_pages = (kv_lens + page - 1) // page
    qo = np.zeros(len(q_lens) + 1, dtype=np.int32)
    np.cumsum(q_lens, out=qo[1:])
    kv = np.zeros(len(q_lens) + 1, dtype=np.int32)
    np.cumsum(n_pages, out=kv[1:])
    last = (kv_lens - (n_pages - 1) * page).astype(np.int32)
    positions = np.concatenate([np.arange(c, c + q) for c, q in zip(cached, q_lens)])
    slots = np.concatenate(
        [pl[np.arange(c, c + q) // page] * page + np.arange(c, c + q) % page
         for pl, c, q in zip(batch.page_lists, cached, q_lens)]
    ).astype(np.int64)
    qo_cpu = torch.from_numpy(qo).pin_memory()
    return PrefillMeta(
        num_tokens=int(qo[-1]),
        qo_indptr=qo_cpu.to(device, non_blocking=True),
        qo_indptr_cpu=qo_cpu,
        kv_indptr_cpu=torch.from_numpy(kv).pin_memory(),
        kv_indices=_to_device(np.concatenate([pl[:n] for pl, n in zip(batch.page_lists, n_pages)]), device),
        last_page_len_cpu=torch.from_numpy(last).pin_memory(),
        slot_mapping=_to_device(slots, device, torch.int64),
        positions=_to_device(positions, device, torch.int64),
    )


def dummy_decode_meta(bs: int, cfg: Fp8ServeConfig, device) -> DecodeMeta:
    """Capture-time metadata: one page (the null page) per row."""
    return DecodeMeta(
        batch_size=bs,
        kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
        kv_indices=torch.zeros(bs, dtype=torch.int32, device=device),
        last_page_len_cpu=torch.ones(bs, dtype=torch.int32),
        seq_lens=torch.ones(bs, dtype=torch.int32, device=device),
        block_tables=torch.zeros(bs, 1, dtype=torch.int32, device=device),
        slot_mapping=torch.zeros(bs, dtype=torch.int64, device=device),
        max_seq_len=1,
        graph_bs=bs,
    )
