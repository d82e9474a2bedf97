"""Simulated device and pinned tensors, so CPU-only CI exercises the dispatch layer's D2H/H2D detection.

``as_device(t)`` returns a CPU tensor that the dispatch layer treats as device-resident: ``.item()``, ``.tolist()``,
``.cpu()``, ``.numpy()`` and ``.to("cpu")`` on it dispatch the same aten ops (``_local_scalar_dense``, ``_to_copy``)
that a CUDA tensor would, and results of ops on it stay "on the device". ``as_pinned(t)`` marks a host tensor as
page-locked. Importing this module imports torch; nothing else in flashcheck imports it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

__all__ = ["SimulatedDeviceTensor", "SimulatedPinnedTensor", "as_device", "as_pinned"]

_CPU = torch.device("cpu")


def _to_cpu(t: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        out = torch.ops.aten._to_copy.default(t, device=_CPU)
    host: torch.Tensor = out.as_subclass(torch.Tensor)
    return host


def _targets_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    for a in (*args[1:], kwargs.get("device")):
        if isinstance(a, (str, torch.device)) and str(a).startswith("cpu"):
            return True
    return False


class _Simulated(torch.Tensor):
    """Common base: one __torch_function__ that accepts any mix of simulated tensors (unrelated subclasses would
    each return NotImplemented for the other's type)."""

    _flashcheck_residency: ClassVar[str] = ""

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        first = args[0] if args else None
        if isinstance(first, SimulatedDeviceTensor):
            # On a real device these go through _to_copy; on CPU they would be no-ops, so route them explicitly.
            if func in (torch.Tensor.cpu, torch.Tensor.numpy) or (
                func is torch.Tensor.to and _targets_cpu(args, kwargs)
            ):
                host = _to_cpu(first)
                return host.numpy() if func is torch.Tensor.numpy else host
            if func is torch.Tensor.tolist:
                return _to_cpu(first).tolist()
        with torch._C.DisableTorchFunctionSubclass():
            ret = func(*args, **kwargs)
        if func in torch.overrides.get_default_nowrap_functions():
            return ret
        out_cls = type(first) if isinstance(first, _Simulated) else cls
        return torch._tensor._convert(ret, out_cls)  # type: ignore[no-untyped-call]


class SimulatedDeviceTensor(_Simulated):
    """A CPU tensor the dispatch layer sees as device memory (``_flashcheck_residency = "device"``)."""

    _flashcheck_residency: ClassVar[str] = "device"


class SimulatedPinnedTensor(_Simulated):
    """A CPU tensor the dispatch layer sees as pinned (page-locked) host memory."""

    _flashcheck_residency: ClassVar[str] = "pinned"


def as_device(t: torch.Tensor) -> SimulatedDeviceTensor:
    """View `t` as a simulated device tensor (no copy)."""
    return t.as_subclass(SimulatedDeviceTensor)


def as_pinned(t: torch.Tensor) -> SimulatedPinnedTensor:
    """View `t` as simulated pinned host memory (no copy)."""
    return t.as_subclass(SimulatedPinnedTensor)
