"""Runtime checker: hooks torch/CUDA events into a pure monitor, a workspace arena, runtime properties.

``from flashcheck.runtime import Checker`` is torch-free until the checker is entered.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'flashcheck.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value
