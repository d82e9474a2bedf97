"""Inverse frequencies for plain, NTK-aware and YaRN-scaled RoPE."""
from __future__ import annotations

import math

import torch

from yarnserve.bands import RopeBand, Scaling


@torch.jit.script
def yarn_ramp(low: float, high: float, dim: int) -> torch.Tensor:
    assert dim > 0  # ok: FC109
    if low == high:
        high += 0.001
    ramp = (torch.arange(dim, dtype=torch.float32) - low) / (high - low)
    return torch.clamp(ramp, 0.0, 1.0)


def _correction_dim(num_rotations: float, dim: int, base: float, max_pos: int) -> float:
    return (dim * math.log(max_pos / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def inv_freq_for_band(band: RopeBand, rot_dim: int, base: float, original_max: int, device) -> torch.Tensor:
    exponents = torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device) / rot_dim
    if band.scaling is Scaling.NONE:
        return 1.0 / (base ** exponents)
    if band.scaling is Scaling.NTK:
        ntk_base = base * band.factor ** (rot_dim / (rot_dim - 2))
        return 1.0 / (ntk_base ** exponents)
    extrapolated = 1.0 / (base ** exponents)
    interpolated = extrapolated / band.factor
    low = max(math.floor(_correction_dim(band.beta_fast, rot_dim, base, original_max)), 0)
    high = min(math.ceil(_correction_dim(band.beta_slow, rot_dim, base, original_max)), rot_dim - 1)
    keep = 1.0 - yarn_ramp(float(low), float(high), rot_dim // 2).to(device)
    return interpolated * (1.0 - keep) + extrapolated * keep


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor):
    cos, sin = cos_sin[:, 0].unsqueeze(1), cos_sin[:, 1].unsqueeze(1)

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    return rot(q), rot(k)
