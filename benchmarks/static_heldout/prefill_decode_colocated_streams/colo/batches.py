"""Host-built batches for the two sides of the engine."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np
import torch


@dataclass
class PrefillBatch:
    rids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    qo_indptr: torch.Tensor
    qo_lens: torch.Tensor
    kv_lens: torch.Tensor
    kv_lens_np: np.ndarray
    kv_indptr_cpu: torch.Tensor
    kv_cu_lens: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    block_tables: torch.Tensor

    @property
    def batch_size(self) -> int:
        return len(self.rids)


@dataclass
class DecodeBatch:
    rids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indices: torch.Tensor

    @property
    def batch_size(self) -> int:
        return len(self.rids)


@torch.jit.script
def next_positions(seq_lens: torch.Tensor, step: int) -> torch.Tensor:
    assert step >= 0  # ok: FC109
    return (seq_lens - 1 + step).to(torch.int64)


def _cumsum0(x: np.ndarray) -> np.ndarray:
    out = np.zeros(len(x) + 1, dtype=np.int32)
    np.cumsum(x, out=out[1:])
    return out


def build_prefill_batch(
    rids: Sequence[int],
    prompts: Sequence[Sequence[int]],
    prefix_lens: Sequence[int],
    page_lists: Sequence[Sequence[int]],
    page_size: int,
    max_pages: int,
    device: torch.device,
) -> PrefillBatch:
    qo_np = np.array([len(p) - k for p, k in zip(prompts, prefix_lens)], dtype=np.int32)
    kv_np = np.array([len(p) for p in prompts], dtype=np.int32)
    pages_np = (kv_np + page_size - 1) // page_size
    ids_np = np.concatenate([np.asarray(p[k:], dtype=np.int64) for p, k in zip(prompts, prefix_lens)])
    pos_np = np.concatenate([np.arange(k, len(p), dtype=np.int64) for p, k in zip(prompts, prefix_lens)])
    flat_pages = np.concatenate([np.asarray(pl[:n], dtype=np.int32) for pl, n in zip(page_lists, pages_np)])
    table_np = np.zeros((len(rids), max_pages), dtype=np.int32)
    for i, pl in enumerate(page_lists):
        table_np[i, : len(pl)] = pl

    def up(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(device, non_blocking=True)

    return PrefillBatch(
        rids=list(rids),
        input_ids=up(ids_np),
        positions=up(pos_np),
        qo_indptr=up(_cumsum0(qo_np)),
        qo_lens=up(qo_np),
        kv_lens=up(kv_np),
        kv_lens_np=kv_np,
        kv_indptr_cpu=torch.from_numpy(_cumsum0(pages_np)),
        kv_cu_lens=up(_cumsum0(kv_np)),
        kv_indices=up(flat_pages),
        last_page_len_cpu=torch.from_numpy(((kv_np - 1) % page_size + 1).astype(np.int32)),
        block_tables=up(table_np),
    )


def build_decode_batch(
    rids: Sequence[int],
    last_tokens: Sequence[int],
    seq_lens: Sequence[int],
    flat_pages: np.ndarray,
    device: torch.device,
) -> DecodeBatch:
    seq_lens_cpu = torch.tensor(list(seq_lens), dtype=torch.int32)
    return DecodeBatch(
        rids=list(rids),
        input_ids=torch.tensor(list(last_tokens), dtype=torch.int64).to(device, non_blocking=True),
        positions=next_positions(seq_lens_cpu, 0).to(device, non_blocking=True),
        seq_lens=seq_lens_cpu.to(device, non_blocking=True),
        seq_lens_cpu=seq_lens_cpu,
        kv_indices=torch.from_numpy(flat_pages).to(device, non_blocking=True),
    )
