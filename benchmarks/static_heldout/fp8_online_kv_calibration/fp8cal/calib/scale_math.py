from __future__ import annotations

import torch


@torch.jit.script
def amax_to_scale(amax: torch.Tensor, fp8_max: float, margin: float) -> torch.Tensor:
    assert fp8_max > 0.0  # ok: FC109
    return torch.clamp(amax * margin / fp8_max, min=1e-6)
