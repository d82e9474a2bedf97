"""Requests and the per-step forward batch (device tensors beside their host mirrors)."""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, List, Optional

import numpy as np
import torch

if TYPE_CHECKING:
    from srt.attention.flashinfer_backend import SideMoEFlashInferBackend


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclasses.dataclass
class Req:
    rid: int
    page_ids: List[int]
    seq_len: int
    last_token: int
    extend_len: int = 1


@dataclasses.dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: np.ndarray
    out_cache_loc: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    last_page_len_np: np.ndarray
    block_tables: torch.Tensor
    extend_lens: Optional[torch.Tensor] = None
    extend_lens_cpu: Optional[np.ndarray] = None
    attn_backend: Optional["SideMoEFlashInferBackend"] = None

    @classmethod
    def from_reqs(cls, reqs: List[Req], mode: ForwardMode, device: torch.device, page_size: int,
                  max_pages_per_req: int, attn_backend=None) -> "ForwardBatch":
        seq_lens_np = np.array([r.seq_len for r in reqs], dtype=np.int32)
        pages = (seq_lens_np + page_size - 1) // page_size
        indptr_np = np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr_np[1:])
        indices_np = np.concatenate([np.asarray(r.page_ids[:n], dtype=np.int32) for r, n in zip(reqs, pages)])
        last_np = (seq_lens_np - (pages - 1) * page_size).astype(np.int32)
        tables_np = np.zeros((len(reqs), max_pages_per_req), dtype=np.int32)
        for i, r in enumerate(reqs):
            tables_np[i, : pages[i]] = r.page_ids[: pages[i]]
        ext_np = np.array([r.extend_len for r in reqs], dtype=np.int32)
        tok_loc = np.array([r.page_ids[(r.seq_len - 1) // page_size] * page_size + (r.seq_len - 1) % page_size
                            for r in reqs], dtype=np.int64)
        return cls(
            forward_mode=mode,
            batch_size=len(reqs),
            input_ids=torch.tensor([r.last_token for r in reqs], dtype=torch.int64, device=device),
            positions=torch.from_numpy(seq_lens_np - 1).to(device, non_blocking=True),
            seq_lens=torch.from_numpy(seq_lens_np).to(device, non_blocking=True),
            seq_lens_cpu=seq_lens_np,
            out_cache_loc=torch.from_numpy(tok_loc).to(device, non_blocking=True),
            kv_indptr_cpu=torch.from_numpy(indptr_np).pin_memory(),
            kv_indices=torch.from_numpy(indices_np).to(device, non_blocking=True),
            kv_last_page_len=torch.from_numpy(last_np).to(device, non_blocking=True),
            last_page_len_np=last_np,
            block_tables=torch.from_numpy(tables_np).to(device, non_blocking=True),
            extend_lens=torch.from_numpy(ext_np).to(device, non_blocking=True),
            extend_lens_cpu=ext_np,
            attn_backend=attn_backend,
        )
