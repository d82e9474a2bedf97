"""Sequence-length bookkeeping shared by the attention implementations."""

import os
from dataclasses import dataclass
from typing import Optional

import torch

ATTENTION = os.getenv("ATTENTION", "flashinfer")
# With FlashInfer every page holds one token, so a block table is a list of slots.
BLOCK_SIZE = 1 if ATTENTION == "flashinfer" else 16
_SUPPORTED_ATTENTION = ("flashinfer", "flashdecoding", "paged")


def attention_backend() -> str:
    assert ATTENTION in _SUPPORTED_ATTENTION, f"unknown ATTENTION={ATTENTION}"  # ok: FC109
    return ATTENTION


@dataclass
class Seqlen:
    input_lengths: torch.Tensor
    cache_lengths: torch.Tensor
    cu_seqlen_q: Optional[torch.Tensor]
    cu_seqlen_k: Optional[torch.Tensor]
    max_q: int
    max_k: int

    def __init__(
        self,
        input_lengths: torch.Tensor,
        cache_lengths: torch.Tensor,
        cu_seqlen_q: Optional[torch.Tensor] = None,
        max_q: Optional[int] = None,
        max_k: Optional[int] = None,
    ):
        self.input_lengths = input_lengths
        self.cache_lengths = cache_lengths
        device = input_lengths.device
        n = input_lengths.shape[0]
        if cu_seqlen_q is None:
            # decode: one query token per sequence
            cu_seqlen_q = torch.arange(n + 1, device=device, dtype=torch.int32)
            max_q = 1
        else:
            assert cu_seqlen_q.shape[0] == n + 1, "cu_seqlen_q needs batch_size + 1 offsets"  # expect: FC109
        total = input_lengths + cache_lengths
        cu_seqlen_k = torch.zeros(n + 1, device=device, dtype=torch.int32)
        cu_seqlen_k[1:] = torch.cumsum(total, -1)
        if max_k is None:
            # callers that do not track the longest sequence get it from the lengths
            max_k = int(total.max())  # expect: FC101
        self.cu_seqlen_q = cu_seqlen_q
        self.cu_seqlen_k = cu_seqlen_k
        self.max_q = max_q
        self.max_k = max_k

    def clamp(self, max: int) -> "Seqlen":
        # FlashInfer applies the window itself (window_left), nothing to clamp here.
        return self
