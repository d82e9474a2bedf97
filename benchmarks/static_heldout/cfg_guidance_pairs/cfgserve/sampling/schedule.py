"""Guidance-scale schedules over the image-token grid (strong guidance for the
coarse layout in the first rows, weaker for the texture that follows)."""
from __future__ import annotations

import math


def guidance_schedule(kind: str, step: int, total: int, scale: float) -> float:
    assert 0 <= step <= total, (step, total)  # expect: FC109
    if kind == "constant" or scale <= 1.0:
        return scale
    t = step / max(1, total)
    if kind == "linear":
        return 1.0 + (scale - 1.0) * (1.0 - t)
    if kind == "cosine":
        return 1.0 + (scale - 1.0) * 0.5 * (1.0 + math.cos(math.pi * t))
    if kind == "power":
        return 1.0 + (scale - 1.0) * (1.0 - t) ** 2
    raise ValueError(f"unknown guidance schedule {kind!r}")
