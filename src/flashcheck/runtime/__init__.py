"""Runtime checker: hooks torch/CUDA events into a pure monitor, a workspace arena, runtime properties.

``from flashcheck.runtime import Checker`` is torch-free until the checker is entered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flashcheck._lazy import lazy_attributes

__all__ = ["Arena", "Checker", "Event", "Monitor"]

_LAZY = {
    "Checker": "flashcheck.runtime.checker",
    "Arena": "flashcheck.runtime.arena",
    "Event": "flashcheck.runtime.monitor",
    "Monitor": "flashcheck.runtime.monitor",
}

if TYPE_CHECKING:
    from flashcheck.runtime.arena import Arena
    from flashcheck.runtime.checker import Checker
    from flashcheck.runtime.monitor import Event, Monitor


__getattr__ = lazy_attributes(__name__, _LAZY)
