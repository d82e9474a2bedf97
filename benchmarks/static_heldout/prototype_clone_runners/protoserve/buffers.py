"""Persistent decode buffers and how they are cloned.

A ``DecodeBuffers`` holds the device tensors a graph-mode decode wrapper is bound to and
the pinned host mirrors the planner reads. Its copy protocol is the contract the bucket
runners rely on:

* ``copy.copy(bufs)`` is a *view* of the same storage. Every bucket graph of a shared pool
  reads ``kv_indptr[: bs + 1]`` of the one max-size buffer, as SGLang shares ``kv_indptr``
  across batch sizes.
* ``copy.deepcopy(bufs)`` re-creates every tensor: the result is a private buffer set that
  no captured graph has seen (an eager path, a deep-cloned bucket).
"""

from __future__ import annotations

import copy
import logging
from typing import Dict

import torch

logger = logging.getLogger(__name__)


class DecodeBuffers:
    def __init__(self, max_bs: int, max_pages: int, device: torch.device | str):
        self.max_bs = max_bs
        self.max_pages = max_pages
        self.device = device
        # device side: what the wrapper and the kernels read
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)
        # host side: what plan() reads
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.seq_lens_cpu = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)

    # -- copy protocol -------------------------------------------------------------------

    def __copy__(self) -> "DecodeBuffers":
        new = DecodeBuffers.__new__(DecodeBuffers)
        new.max_bs = self.max_bs
        new.max_pages = self.max_pages
        new.device = self.device
        new.kv_indptr = self.kv_indptr
        new.kv_indices = self.kv_indices
        new.kv_last_page_len = self.kv_last_page_len
        new.seq_lens = self.seq_lens
        new.kv_indptr_cpu = self.kv_indptr_cpu
        new.kv_last_page_len_cpu = self.kv_last_page_len_cpu
        new.seq_lens_cpu = self.seq_lens_cpu
        return new

    def __deepcopy__(self, memo: Dict[int, object]) -> "DecodeBuffers":
        new = DecodeBuffers.__new__(DecodeBuffers)
        memo[id(self)] = new
        new.max_bs = self.max_bs
        new.max_pages = self.max_pages
        new.device = self.device
        new.kv_indptr = torch.zeros_like(self.kv_indptr)
        new.kv_indices = torch.zeros_like(self.kv_indices)
        new.kv_last_page_len = torch.ones_like(self.kv_last_page_len)
        new.seq_lens = torch.zeros_like(self.seq_lens)
        new.kv_indptr_cpu = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        new.kv_last_page_len_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        new.seq_lens_cpu = torch.zeros(self.max_bs, dtype=torch.int32, pin_memory=True)
        return new

    def shares_storage_with(self, other: "DecodeBuffers") -> bool:
        return self.kv_indices.data_ptr() == other.kv_indices.data_ptr()

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.kv_indptr, self.kv_indices, self.kv_last_page_len, self.seq_lens)
        )


def private_copy(bufs: DecodeBuffers) -> DecodeBuffers:
    """A buffer set no captured graph reads (see module docstring)."""
    out = copy.deepcopy(bufs)
    logger.debug("private decode buffers: %.1f MiB", out.nbytes() / 2**20)
    return out
