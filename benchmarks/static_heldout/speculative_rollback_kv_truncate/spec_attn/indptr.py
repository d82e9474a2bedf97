"""Small helpers shared by the backend and the engine."""

from __future__ import annotations

import torch


def build_qo_indptr(lens: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum of per-row query lengths, on the lengths' device."""
    return torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)]).to(torch.int32)


def describe_wrapper(dec) -> str:
    return f"{type(dec).__name__}(backend={dec._backend})"  # expect: FC103
