"""Scripted helpers that run inside the captured MoE layers."""

import torch


@torch.jit.script
def remap_topk_ids(topk_ids: torch.Tensor, log2phy: torch.Tensor, num_physical: int) -> torch.Tensor:
    """Logical expert ids -> physical slots (the replica ``log2phy`` currently names for each expert)."""
    assert num_physical > 0  # ok: FC109
    phys = log2phy.index_select(0, topk_ids.flatten().long())
    return phys.view(topk_ids.shape).clamp_(0, num_physical - 1)


@torch.jit.script
def count_slot_tokens(phys_ids: torch.Tensor, counts_row: torch.Tensor) -> None:
    flat = phys_ids.flatten().long()
    counts_row.index_add_(0, flat, torch.ones_like(flat, dtype=counts_row.dtype))
