"""Per-step batch description, with the DP-attention fields filled after the MLP-sync all-gather."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import List, Optional

import torch


class ForwardMode(enum.IntEnum):
    EXTEND, DECODE, IDLE = 1, 2, 3

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self is ForwardMode.IDLE


@dataclass
class ForwardBatch:
    """Built by the TP worker from the scheduler's batch; tensors without ``_cpu`` live on the device."""

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    # DP attention: token counts of every rank (host list, device copy) and this rank's slot
    global_num_tokens_cpu: Optional[List[int]] = None
    global_num_tokens_gpu: Optional[torch.Tensor] = None
    dp_local_start_pos: Optional[torch.Tensor] = None
    dp_local_num_tokens: Optional[torch.Tensor] = None
    gathered_buffer: Optional[torch.Tensor] = None
