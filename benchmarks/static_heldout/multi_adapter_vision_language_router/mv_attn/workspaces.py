"""Workspace factories of the language-model attention backend."""

from __future__ import annotations

import torch


def make_prompt_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def decode_workspace_bytes(max_batch: int, num_qo_heads: int, head_dim: int, max_pages: int) -> int:
    # split-k partial outputs and LSEs for the largest batch, plus the planner's index arrays
    splits = max(1, max_pages // (max_batch * 8))
    return max_batch * num_qo_heads * splits * (head_dim + 1) * 4 + (max_batch + 1) * 64
