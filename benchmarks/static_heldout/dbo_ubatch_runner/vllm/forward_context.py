"""Per-step forward context: which attention metadata the layers of the current (micro-)batch read."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

if TYPE_CHECKING:
    from vllm.v1.attention.backends.flashinfer import FlashInferMetadata
    from vllm.v1.attention.backends.utils import UBatchSlice


@dataclass
class ForwardContext:
    attn_metadata: Dict[str, "FlashInferMetadata"]
    num_tokens: int
    ubatch_slices: Optional[List["UBatchSlice"]] = None
    extra: Dict[str, Any] = field(default_factory=dict)


_forward_context: Optional[ForwardContext] = None


def get_forward_context() -> ForwardContext:
    if _forward_context is None:
        raise RuntimeError("forward context is not set; call the model inside set_forward_context()")
    return _forward_context


def override_forward_context(ctx: Optional[ForwardContext]) -> None:
    """Used by ubatch threads: each micro-batch swaps in its own context when it gets the GPU."""
    global _forward_context
    _forward_context = ctx


@contextmanager
def set_forward_context(attn_metadata, num_tokens: int, ubatch_slices=None):
    global _forward_context
    prev = _forward_context
    _forward_context = ForwardContext(attn_metadata=attn_metadata, num_tokens=num_tokens, ubatch_slices=ubatch_slices)
    try:
        yield _forward_context
    finally:
        _forward_context = prev
