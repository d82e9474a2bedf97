"""Helpers that report what the FlashInfer objects hold (for the /metrics endpoint)."""

from typing import Iterable

_PRIVATE_BUFS = ("_int_workspace_buffer", "_float_workspace_buffer")


def wrapper_workspace_bytes(wrapper) -> int:
    total = 0
    for name in _PRIVATE_BUFS:
        buf = getattr(wrapper, name, None)  # expect: FC103
        if buf is not None:
            total += buf.numel() * buf.element_size()
    return total


def total_workspace_bytes(wrappers: Iterable) -> int:
    return sum(wrapper_workspace_bytes(w) for w in wrappers)
