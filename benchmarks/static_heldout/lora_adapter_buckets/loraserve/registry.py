from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")
_LORA_BACKENDS: dict[str, type] = {}


def register_lora_backend(name: str) -> Callable[[type[T]], type[T]]:
    assert name not in _LORA_BACKENDS, f"duplicate LoRA backend {name}"  # expect: FC109

    def _wrap(cls: type[T]) -> type[T]:
        _LORA_BACKENDS[name] = cls
        return cls

    return _wrap


def get_lora_backend(name: str) -> type:
    return _LORA_BACKENDS[name]
