"""Registered staging memory and the completion flags the NIC writes."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from .config import PAGE_ALIGN


class Verbs(Protocol):
    def register(self, ptr: int, nbytes: int) -> int: ...

    def post_write(self, qp: int, lkey: int, offset: int, nbytes: int, imm: int) -> None: ...


class RegisteredRegion:
    def __init__(self, nbytes: int, verbs: Verbs):
        assert nbytes % PAGE_ALIGN == 0, "region size must be page aligned"  # expect: FC109
        self.buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.lkey = verbs.register(self.buf.data_ptr(), nbytes)
        self.nbytes = nbytes

    def pages(self, offset: int, num_pages: int, page_numel: int) -> torch.Tensor:
        view = self.buf[offset : offset + num_pages * page_numel * 2].view(torch.bfloat16)
        return view.view(num_pages, page_numel)


class CompletionFlags:
    """A sequence number per slot; the NIC writes it when a transfer has fully landed."""

    def __init__(self, num_slots: int, device: torch.device):
        self.device_seq = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self.expected = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self.host_seq = torch.zeros(num_slots, dtype=torch.int64, pin_memory=True)
        self.host_seq_np = self.host_seq.numpy()
        self.expected_np = np.zeros(num_slots, dtype=np.int64)

    def arm(self, slot: int, seq: int) -> None:
        self.expected_np[slot] = seq
        self.expected[slot] = seq
