"""Decode batch of one step: decode rows first, then (optionally) one piggybacked prompt chunk."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np
import torch

from prio.requests import Request


@dataclasses.dataclass
class DecodeBatch:
    num_rows: int
    num_decode_rows: int
    chunk_rows: int
    slots: torch.Tensor
    input_ids: torch.Tensor
    page_counts: torch.Tensor
    last_page_len_np: np.ndarray
    kv_indptr_np: np.ndarray
    kv_indices: torch.Tensor
    chunk_qo_indptr_np: np.ndarray
    out_loc: torch.Tensor
    high_rows: Optional[torch.Tensor] = None
    temperatures: Optional[torch.Tensor] = None

    @classmethod
    def build(cls, rows: List[Request], chunk: Optional[Request], chunk_len: int, page_table_np: np.ndarray,
              page_size: int, device: torch.device) -> "DecodeBatch":
        seq = np.array([r.seq_len + 1 for r in rows], dtype=np.int32)
        if chunk is not None:
            seq = np.append(seq, chunk.prefilled + chunk_len).astype(np.int32)
        slots = np.array([r.slot for r in rows] + ([chunk.slot] if chunk is not None else []), dtype=np.int64)
        counts = (seq + page_size - 1) // page_size
        indptr = np.zeros(counts.size + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        indices = np.concatenate([page_table_np[s, :c] for s, c in zip(slots, counts)])
        last = (seq - (counts - 1) * page_size).astype(np.int32)
        toks = [r.output_ids[-1] if r.output_ids else r.prompt_ids[-1] for r in rows]
        pairs = [(r.slot, r.seq_len) for r in rows]
        if chunk is not None:
            toks += chunk.prompt_ids[chunk.prefilled : chunk.prefilled + chunk_len]
            pairs += [(chunk.slot, p) for p in range(chunk.prefilled, chunk.prefilled + chunk_len)]
        loc = np.array([page_table_np[s, p // page_size] * page_size + p % page_size for s, p in pairs],
                       dtype=np.int64)
        return cls(
            num_rows=int(slots.size),
            num_decode_rows=len(rows),
            chunk_rows=chunk_len if chunk is not None else 0,
            slots=torch.from_numpy(slots).to(device, non_blocking=True),
            input_ids=torch.tensor(toks, dtype=torch.int64, device=device),
            page_counts=torch.from_numpy(counts.astype(np.int32)).to(device, non_blocking=True),
            last_page_len_np=last,
            kv_indptr_np=indptr,
            kv_indices=torch.from_numpy(indices).to(device, non_blocking=True),
            chunk_qo_indptr_np=np.array([0, chunk_len], dtype=np.int32),
            out_loc=torch.from_numpy(loc).to(device, non_blocking=True),
        )
