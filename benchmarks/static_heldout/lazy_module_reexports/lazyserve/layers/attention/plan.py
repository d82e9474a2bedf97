"""Planning facade: the names backends use, bound to the implementation for the
installed FlashInfer."""
from __future__ import annotations

from . import _impl
from ._impl import DecodeWrapper, PlanDims

plan_decode = _impl.plan_decode
plan_prefill = _impl.plan_prefill
window_needed = _impl.window_needed
workspace_bytes_in_use = _impl.workspace_bytes_in_use

__all__ = [
    "DecodeWrapper",
    "PlanDims",
    "plan_decode",
    "plan_prefill",
    "window_needed",
    "workspace_bytes_in_use",
]
