"""One buffer set: device buffers bound to a slot's graphs and their pinned mirrors."""

from __future__ import annotations

import dataclasses

import torch

from dbuf.config import DoubleBufferConfig


@dataclasses.dataclass
class BufferSet:
    slot: int
    # device buffers, bound to the graph-mode wrappers of this slot
    indptr: torch.Tensor
    indices: torch.Tensor
    last_len: torch.Tensor
    # pinned mirrors, filled by the stager with numpy
    indptr_host: torch.Tensor
    indices_host: torch.Tensor
    last_len_host: torch.Tensor
    # recorded on the copy stream once the H2D copies of this set are queued
    ready: torch.cuda.Event
    # recorded after the last replay that read this set
    consumed: torch.cuda.Event
    nnz: int = 0
    batch_size: int = 0


def _pinned(n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(n, dtype=dtype, pin_memory=True)


def make_buffer_set(cfg: DoubleBufferConfig, device: torch.device, slot: int) -> BufferSet:
    i32 = torch.int32
    return BufferSet(
        slot=slot,
        indptr=torch.zeros(cfg.max_batch + 1, dtype=i32, device=device),
        indices=torch.zeros(cfg.max_pages, dtype=i32, device=device),
        last_len=torch.ones(cfg.max_batch, dtype=i32, device=device),
        indptr_host=_pinned(cfg.max_batch + 1, i32),
        indices_host=_pinned(cfg.max_pages, i32),
        last_len_host=_pinned(cfg.max_batch, i32),
        ready=torch.cuda.Event(),
        consumed=torch.cuda.Event(),
    )
