"""Host-side views of array-likes (numpy arrays, sequences, torch tensors on any device) without importing torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["as_host_array", "as_host_arrays", "device_of"]


def as_host_array(x: Any, dtype: Any = np.int64) -> npt.NDArray[Any]:
    """A numpy copy of `x`. Torch tensors are detached and copied to the host (call this outside hot regions)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        return np.asarray(x.detach().cpu().numpy(), dtype=dtype)
    return np.asarray(x, dtype=dtype)


def device_of(x: Any) -> str:
    """``"cpu"``, ``"cuda:0"``..., or ``"host"`` for non-tensors."""
    dev = getattr(x, "device", None)
    return "host" if dev is None else str(dev)


def as_host_arrays(xs: Sequence[Any], dtype: Any = np.int64) -> list[npt.NDArray[Any] | None]:
    """`as_host_array` of each item (None stays None), with one device-to-host transfer per device: the tensors of
    one accelerator are flattened, cast to int64 and concatenated there first. For integer metadata (indptr,
    indices, lengths): a float tensor would be truncated."""
    out: list[npt.NDArray[Any] | None] = [None] * len(xs)
    by_device: dict[str, list[int]] = {}
    for i, x in enumerate(xs):
        if x is None:
            continue
        dev = device_of(x)
        if dev in ("host", "cpu"):
            out[i] = as_host_array(x, dtype)
        else:
            by_device.setdefault(dev, []).append(i)
    for idx in by_device.values():
        import torch

        flat = [xs[i].detach().reshape(-1).long() for i in idx]
        host = torch.cat(flat).cpu().numpy() if len(flat) > 1 else flat[0].cpu().numpy()
        at = 0
        for i, f in zip(idx, flat, strict=True):
            n = int(f.numel())
            out[i] = np.asarray(host[at : at + n], dtype=dtype).reshape(tuple(xs[i].shape))
            at += n
    return out
