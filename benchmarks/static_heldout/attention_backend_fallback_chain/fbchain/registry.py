"""Registry of attention backend classes; plugins add theirs with ``@register_backend``."""
from __future__ import annotations

from typing import Callable, Dict, Type, TypeVar

T = TypeVar("T", bound=type)

BACKEND_REGISTRY: Dict[str, Type] = {}
PRIORITY: Dict[str, int] = {}


def register_backend(name: str, priority: int) -> Callable[[T], T]:
    assert name not in BACKEND_REGISTRY, "an attention backend of that name is already registered"  # expect: FC109

    def deco(cls: T) -> T:
        BACKEND_REGISTRY[name] = cls
        PRIORITY[name] = priority
        cls.name = name
        return cls

    return deco


def ordered_names() -> list:
    return sorted(BACKEND_REGISTRY, key=lambda n: PRIORITY[n])
