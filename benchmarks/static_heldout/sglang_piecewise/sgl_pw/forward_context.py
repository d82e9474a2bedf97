from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, List, Optional

_forward_context: Optional["ForwardContext"] = None


@dataclass
class ForwardContext:
    forward_batch: Any
    attention_layers: List[Any]


def get_forward_context() -> ForwardContext:
    return _forward_context


@contextmanager
def set_forward_context(forward_batch, attention_layers):
    global _forward_context
    prev = _forward_context
    _forward_context = ForwardContext(forward_batch, attention_layers)
    try:
        yield
    finally:
        _forward_context = prev
