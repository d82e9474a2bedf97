"""The three rotations of a DCA query (kept apart from the layers so the kernels team can swap in a fused op)."""

from __future__ import annotations

from typing import Tuple

import torch


def build_cos_sin_cache(max_pos: int, head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    t = torch.arange(max_pos, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _rotate(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def succ_positions(intra_pos: torch.Tensor, chunk_size: int, local_size: int) -> torch.Tensor:
    """Successive-chunk query: ``local_size`` past the previous chunk's end, clamped to the trained range."""
    shifted = intra_pos + local_size
    return torch.where(shifted < chunk_size, shifted + chunk_size - local_size, torch.full_like(intra_pos, chunk_size - 1))  # ok: FC101


def apply_dca_rope(
    q: torch.Tensor,
    intra_pos: torch.Tensor,
    inter_pos: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    chunk_size: int,
    local_size: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # only the rows up to the furthest live position are gathered from
    cache = cos_sin_cache[: intra_pos.max() + local_size + 1]  # expect: FC101
    q_intra = _rotate(q, cache.index_select(0, intra_pos))
    q_succ = _rotate(q, cos_sin_cache.index_select(0, succ_positions(intra_pos, chunk_size, local_size)))
    q_inter = _rotate(q, cos_sin_cache.index_select(0, inter_pos))
    return q_intra, q_succ, q_inter


def apply_key_rope(k: torch.Tensor, key_pos: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    return _rotate(k, cos_sin_cache.index_select(0, key_pos))
