"""Repetition, presence and frequency penalties (TorchScript: fused into one graph node per call)."""
from __future__ import annotations

import torch


@torch.jit.script
def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, rep: torch.Tensor, presence: torch.Tensor,
                    frequency: torch.Tensor) -> torch.Tensor:
    assert logits.shape == counts.shape  # ok: FC109
    seen = counts > 0
    scaled = torch.where(logits > 0, logits / rep[:, None], logits * rep[:, None])
    logits = torch.where(seen, scaled, logits)
    logits = logits - frequency[:, None] * counts.to(logits.dtype)
    return logits - presence[:, None] * seen.to(logits.dtype)
