"""Module-level registry of FlashInfer wrappers.

Custom ops only take tensors and scalars, so the wrappers they run are looked up here by name.
"""

from typing import Any, Dict

_WRAPPERS: Dict[str, Any] = {}


def register_wrapper(name: str, wrapper: Any) -> None:
    if name in _WRAPPERS and _WRAPPERS[name] is not wrapper:
        raise KeyError(f"wrapper {name!r} registered twice")
    _WRAPPERS[name] = wrapper


def get_wrapper(name: str) -> Any:
    try:
        return _WRAPPERS[name]
    except KeyError:
        raise KeyError(f"no FlashInfer wrapper registered as {name!r}") from None


def clear_wrappers() -> None:
    _WRAPPERS.clear()
