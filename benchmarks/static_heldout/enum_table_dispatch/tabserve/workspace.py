"""Workspace allocation, picked per kernel family from a table."""

from __future__ import annotations

import enum
from typing import Callable, Dict

import torch

from tabserve.modes import ForwardMode


class WorkspaceKind(enum.Enum):
    FLOAT = "float"  # FA2/FA3 planners: split-k partial outputs, rewritten by every plan()
    TRTLLM = "trtllm-gen"  # trtllm-gen kernels: multi-CTA semaphores and reduction counters


def _alloc_float(nbytes: int, device: torch.device) -> torch.Tensor:
    # The FA2 planners write every byte they read back, so fresh memory is fine here.
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


def _alloc_counters(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


_ALLOCATORS: Dict[WorkspaceKind, Callable[[int, torch.device], torch.Tensor]] = {
    WorkspaceKind.FLOAT: _alloc_float,
    WorkspaceKind.TRTLLM: _alloc_counters,
}


def allocate_workspace(kind: WorkspaceKind, nbytes: int, device: torch.device) -> torch.Tensor:
    return _ALLOCATORS[kind](nbytes, device)


def zeroed_scratch(nbytes: int, device: torch.device) -> torch.Tensor:
    """Scratch for a kernel that keeps counters in its workspace (trtllm-gen context attention)."""
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    buf.zero_()
    return buf


# Split-k scratch of the ragged prefill planner per forward mode, in MiB.
_EXTEND_WS_MIB = {
    ForwardMode.EXTEND: 512,
    ForwardMode.MIXED: 256,
}


def extend_workspace(mode: ForwardMode, device: torch.device) -> torch.Tensor:
    return torch.zeros(_EXTEND_WS_MIB[mode] << 20, dtype=torch.uint8, device=device)  # expect: FC106
