"""trtllm-gen kernels for the drafter, called directly rather than through a wrapper."""

from __future__ import annotations

from typing import Dict

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache


def decode_scratch_bytes(batch_size: int, num_heads: int) -> int:
    # multi-CTA reductions: one partial row per (request, head, CTA) plus the counters
    return batch_size * num_heads * 16 * 1024 + (4 << 20)


def context_scratch_bytes(num_tokens: int, num_heads: int, head_dim: int) -> int:
    return num_tokens * num_heads * (head_dim + 2) * 4 + (8 << 20)


class ScratchPool:
    """Scratch buffers for the direct kernels, cached by size."""

    __slots__ = ("device", "_bufs", "_zeroed")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._bufs: Dict[int, torch.Tensor] = {}
        self._zeroed: Dict[int, torch.Tensor] = {}

    def get(self, nbytes: int) -> torch.Tensor:
        buf = self._bufs.get(nbytes)
        if buf is None:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)  # expect: FC105
            self._bufs[nbytes] = buf
        return buf

    def get_zeroed(self, nbytes: int) -> torch.Tensor:
        buf = self._zeroed.get(nbytes)
        if buf is None:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)  # ok: FC105
            buf.fill_(0)
            self._zeroed[nbytes] = buf
        return buf


def draft_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    pool: ScratchPool,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
) -> torch.Tensor:
    return trtllm_batch_decode_with_kv_cache(
        query=q,
        kv_cache=kv_cache,
        workspace_buffer=pool.get(decode_scratch_bytes(q.shape[0], q.shape[1])),
        block_tables=block_tables,
        seq_lens=seq_lens,
        max_seq_len=max_seq_len,
        bmm1_scale=scale,
        bmm2_scale=1.0,
    )


def draft_extend(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    pool: ScratchPool,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_q: torch.Tensor,
    cu_kv: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    scale: float,
) -> torch.Tensor:
    return trtllm_batch_context_with_kv_cache(
        query=q,
        kv_cache=kv_cache,
        workspace_buffer=pool.get_zeroed(context_scratch_bytes(q.shape[0], q.shape[1], q.shape[2])),
        block_tables=block_tables,
        seq_lens=seq_lens,
        max_q_len=max_q_len,
        max_kv_len=max_kv_len,
        bmm1_scale=scale,
        bmm2_scale=1.0,
        batch_size=block_tables.shape[0],
        cum_seq_lens_q=cu_q,
        cum_seq_lens_kv=cu_kv,
    )
