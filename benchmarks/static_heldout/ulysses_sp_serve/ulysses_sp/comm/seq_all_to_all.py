"""Ulysses all-to-all: [local_tokens, H, D] <-> [total_tokens, H / sp, D].

Prefill batches are split unevenly across the ranks (the scheduler balances by tokens), so the prefill
exchange takes split sizes from the host shard plan. Decode batches are padded to a multiple of the SP
size and exchanged with equal splits, which is what the decode CUDA graphs capture.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


class SeqAllToAll:
    def __init__(self, group, sp_size: int, num_heads: int, head_dim: int, device: torch.device):
        assert num_heads % sp_size == 0, "attention heads must split evenly across SP ranks"  # expect: FC109
        self.group = group
        self.sp_size = sp_size
        self.local_heads = num_heads // sp_size
        self.head_dim = head_dim
        self.device = device
        self._decode_recv: Optional[torch.Tensor] = None
        self._decode_send: Optional[torch.Tensor] = None

    # ---- prefill: uneven splits from the host plan --------------------------------------------
    def seq_to_head(self, x: torch.Tensor, send_counts: list, recv_counts: list) -> torch.Tensor:
        t, h, d = x.shape
        sp = self.sp_size
        # [t, sp, h/sp, d] -> [sp, t, h/sp, d]: chunk j goes to rank j
        inp = x.reshape(t, sp, h // sp, d).transpose(0, 1).contiguous().reshape(sp * t, h // sp, d)
        out = torch.empty(sum(recv_counts), h // sp, d, dtype=x.dtype, device=x.device)
        dist.all_to_all_single(
            out, inp, output_split_sizes=recv_counts, input_split_sizes=[t] * sp, group=self.group
        )
        return out

    def head_to_seq(self, x: torch.Tensor, send_counts: list, recv_counts: list) -> torch.Tensor:
        total, hl, d = x.shape
        sp = self.sp_size
        local = send_counts[0]
        out = torch.empty(sp * local, hl, d, dtype=x.dtype, device=x.device)
        dist.all_to_all_single(
            out, x.contiguous(), output_split_sizes=[local] * sp, input_split_sizes=recv_counts, group=self.group
        )
        return out.reshape(sp, local, hl, d).transpose(0, 1).reshape(local, sp * hl, d)

    # ---- decode: equal splits, persistent buffers so the graphs keep their addresses ----------
    def _ensure_decode_buffers(self, max_tokens: int, dtype: torch.dtype) -> None:
        if self._decode_recv is None:
            self._decode_recv = torch.empty(  # ok: FC107
                max_tokens, self.local_heads, self.head_dim, dtype=dtype, device=self.device
            )
            self._decode_send = torch.empty_like(self._decode_recv)

    def _recv_view(self, n: int) -> torch.Tensor:
        assert self._decode_recv is not None, "decode buffers are allocated on first use"  # ok: FC109
        return self._decode_recv[:n]

    def decode_seq_to_head(self, x: torch.Tensor) -> torch.Tensor:
        t, h, d = x.shape
        sp = self.sp_size
        self._ensure_decode_buffers(t * sp, x.dtype)
        inp = x.reshape(t, sp, h // sp, d).transpose(0, 1).contiguous()
        out = self._recv_view(t * sp)
        dist.all_to_all_single(out, inp.reshape(sp * t, h // sp, d), group=self.group)
        return out

    def decode_head_to_seq(self, x: torch.Tensor) -> torch.Tensor:
        total, hl, d = x.shape
        sp = self.sp_size
        t = total // sp
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=self.group)
        return out.reshape(sp, t, hl, d).transpose(0, 1).reshape(t, sp * hl, d)
