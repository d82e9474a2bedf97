"""Merging per-chunk candidates on the device, and a graph-safe Gumbel pick."""

from __future__ import annotations

from typing import Optional, Tuple

import torch


@torch.jit.script
def clamp_top_k(k: int, cap: int) -> int:
    assert cap > 0  # ok: FC109
    return max(1, min(k, cap))


def merge_chunk_topk(
    cand_vals: torch.Tensor, cand_ids: torch.Tensor, top_k: torch.Tensor, k: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Global top-``k`` of the candidates; a row whose own top-k is smaller keeps -inf past it."""
    vals, pos = torch.topk(cand_vals, k, dim=-1)
    ids = torch.gather(cand_ids, 1, pos)
    rank = torch.arange(k, device=vals.device).unsqueeze(0)
    vals = vals.masked_fill(rank >= top_k.unsqueeze(1), float("-inf"))
    return vals, ids


def gumbel_pick(
    vals: torch.Tensor, ids: torch.Tensor, temperature: torch.Tensor, noise: Optional[torch.Tensor] = None
) -> torch.Tensor:
    u = torch.rand_like(vals) if noise is None else noise
    g = -torch.log(-torch.log(u.clamp(1e-10, 1.0)))
    pick = torch.argmax(vals / temperature.unsqueeze(1) + g, dim=-1, keepdim=True)
    return torch.gather(ids, 1, pick).squeeze(1)
