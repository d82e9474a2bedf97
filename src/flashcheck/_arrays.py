"""Host-side views of array-likes (numpy arrays, sequences, torch tensors on any device) without importing torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["as_host_array", "device_of"]


def as_host_array(x: Any, dtype: Any = np.int64) -> npt.NDArray[Any]:
    """A numpy copy of `x`. Torch tensors are detached and copied to the host (call this outside hot regions)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        return np.asarray(x.detach().cpu().numpy(), dtype=dtype)
    return np.asarray(x, dtype=dtype)


def device_of(x: Any) -> str:
    """``"cpu"``, ``"cuda:0"``..., or ``"host"`` for non-tensors."""
    dev = getattr(x, "device", None)
    return "host" if dev is None else str(dev)
