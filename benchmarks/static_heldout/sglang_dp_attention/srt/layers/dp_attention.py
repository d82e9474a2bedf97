"""DP attention: each DP rank attends over its own requests; the MoE runs on every rank's tokens, gathered
into one buffer sized for the padded global batch and scattered back afterwards."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from srt.model_executor.forward_batch_info import ForwardBatch

_ATTN_DP_RANK = 0


def initialize_dp_attention(tp_rank: int, tp_size: int, dp_size: int) -> None:
    global _ATTN_DP_RANK
    _ATTN_DP_RANK = tp_rank // (tp_size // dp_size)


def get_attention_dp_rank() -> int:
    return _ATTN_DP_RANK


def dp_gather(global_tokens: torch.Tensor, local_tokens: torch.Tensor, forward_batch: "ForwardBatch") -> None:
    assert global_tokens.is_contiguous(), "the gathered buffer must be contiguous"  # expect: FC109
    global_tokens.zero_()
    start, n = forward_batch.dp_local_start_pos, forward_batch.dp_local_num_tokens
    global_tokens[start : start + n] = local_tokens  # expect: FC101
    dist.all_reduce(global_tokens)


def dp_scatter(local_tokens: torch.Tensor, global_tokens: torch.Tensor, forward_batch: "ForwardBatch") -> None:
    # offsets from the host copy of the per-rank counts (rank * padded size in graph mode)
    start = sum(forward_batch.global_num_tokens_cpu[: get_attention_dp_rank()])
    local_tokens.copy_(global_tokens[start : start + local_tokens.shape[0]])  # ok: FC101
