"""Source markers read by the static verifier (and harmless at run time)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["hot_path"]

F = TypeVar("F", bound=Callable[..., object])


def hot_path(fn: F) -> F:
    """Mark `fn` as a hot-path root (runs before every graph replay or every step).

    ``flashcheck static`` checks everything reachable from it for host syncs, device-to-host copies and
    reallocations. At run time it only sets ``fn.__flashcheck_hot_path__ = True``.
    """
    fn.__flashcheck_hot_path__ = True  # type: ignore[attr-defined]
    return fn
