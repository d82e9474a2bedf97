"""Reversible method patches for the layers that wrap a torch method (``CUDAGraph.replay``, ``capture_begin`` ...).

A `MethodPatch` replaces one attribute of a class with a wrapper built around what was there (so it chains to any
tool that wrapped it before), and on `restore` puts back exactly what the class's own ``__dict__`` held, or removes
the attribute when it was inherited. If another tool wrapped on top of ours meanwhile, ours stays in that chain
(`stranded`): the layer must then make its wrapper inert rather than cut the other tool out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MethodPatch"]

_MISSING = object()


class MethodPatch:
    """One attribute `name` of an owner, wrapped by `apply` and restored by `restore`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.owner: Any = None
        self.wrapper: Any = None
        self._prev_own: Any = _MISSING  # what owner.__dict__ held (missing: the attribute was inherited)
        self.stranded: list[Any] = []  # wrappers left in a chain another tool built on top of

    def apply(self, owner: Any, make: Callable[[Any], Any]) -> Any:
        """Set ``owner.<name>`` to ``make(previous)``, marked as flashcheck's; returns the wrapper."""
        self.owner = owner
        self._prev_own = owner.__dict__.get(self.name, _MISSING)
        wrapper = make(getattr(owner, self.name))
        wrapper.__flashcheck_wrapper__ = True
        setattr(owner, self.name, wrapper)
        self.wrapper = wrapper
        return wrapper

    def restore(self) -> None:
        """Put back what `apply` replaced, unless another wrapper now sits on top of ours (then ours is stranded)."""
        owner, wrapper = self.owner, self.wrapper
        if owner is None or wrapper is None:
            return
        if owner.__dict__.get(self.name) is wrapper:
            if self._prev_own is _MISSING:
                delattr(owner, self.name)
            else:
                setattr(owner, self.name, self._prev_own)
        else:
            self.stranded.append(wrapper)
        self.wrapper = None
