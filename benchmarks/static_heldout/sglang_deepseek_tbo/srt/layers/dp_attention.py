"""DP attention: each DP rank runs attention over its own requests; the MoE layers see the
tokens of every rank, gathered into one padded buffer."""

from __future__ import annotations

import enum
from typing import Callable, Dict

import torch
import torch.distributed as dist

from srt.model_executor.forward_batch_info import ForwardBatch


class DpPaddingMode(enum.Enum):
    MAX_LEN = "max_len"  # all-gather, every rank padded to the longest
    SUM_LEN = "sum_len"  # all-reduce into a buffer of the summed length, each rank writes its slot


def _gather_max_len(local: torch.Tensor, out: torch.Tensor, group) -> torch.Tensor:
    dist.all_gather_into_tensor(out, local, group=group)
    return out


def _gather_sum_len(local: torch.Tensor, out: torch.Tensor, group) -> torch.Tensor:
    dist.all_reduce(out, group=group)
    return out


_GATHER: Dict[DpPaddingMode, Callable[..., torch.Tensor]] = {
    DpPaddingMode.MAX_LEN: _gather_max_len,
    DpPaddingMode.SUM_LEN: _gather_sum_len,
}


def dp_gather_padded(local_tokens: torch.Tensor, forward_batch: ForwardBatch, mode: DpPaddingMode, group, rank: int) -> torch.Tensor:
    """Gather the hidden states of every DP rank for the MoE layers."""
    counts = forward_batch.global_num_tokens_cpu
    hidden = local_tokens.shape[1]
    if mode is DpPaddingMode.MAX_LEN:
        max_len = max(counts)  # ok: FC101
        assert local_tokens.shape[0] <= max_len, "local tokens exceed the gathered length"  # expect: FC109
        padded = local_tokens.new_zeros((max_len, hidden))
        padded[: local_tokens.shape[0]] = local_tokens
        out = local_tokens.new_empty((max_len * len(counts), hidden))
        return _GATHER[mode](padded, out, group)
    total = int(forward_batch.global_num_tokens_gpu.sum())  # expect: FC101
    out = local_tokens.new_zeros((total, hidden))
    start = sum(counts[:rank])
    out[start : start + local_tokens.shape[0]] = local_tokens
    return _GATHER[mode](out, out, group)
