"""Generation of batch shapes and replay scenarios (strategies, state machines, the ``@fuzz`` decorator).

The package itself is callable, so ``@flashcheck.fuzz(target=..., budget=...)`` works whether or not a submodule
was imported first (``flashcheck.fuzz`` is then this package, not the function). The typed spelling is
``from flashcheck.fuzz import fuzz``. Importing the package imports neither Hypothesis nor torch.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

__all__ = ["fuzz"]

if TYPE_CHECKING:
    from flashcheck.fuzz.api import fuzz


def __getattr__(name: str) -> Any:
    if name == "fuzz":
        from flashcheck.fuzz.api import fuzz

        return fuzz
    raise AttributeError(f"module 'flashcheck.fuzz' has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from flashcheck.fuzz.api import fuzz

        return fuzz(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
