"""The per-step context the attention op reads its metadata and implementation from.

The compiled graph cannot carry Python objects, so the op only receives the layer name; the
runner sets the context around every model call (and every graph capture)."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Dict, Iterator, Optional

if TYPE_CHECKING:
    from coattn_exec.metadata import AttnMetadata
    from coattn_layers.attention import FlashInferImpl


@dataclasses.dataclass
class ForwardContext:
    attn_metadata: Optional["AttnMetadata"]
    attn_impls: Dict[str, "FlashInferImpl"]
    num_tokens: int


_forward_context: Optional[ForwardContext] = None


def get_forward_context() -> ForwardContext:
    if _forward_context is None:
        raise RuntimeError("attention op called outside set_forward_context()")
    return _forward_context


@contextlib.contextmanager
def set_forward_context(
    attn_metadata: Optional["AttnMetadata"], attn_impls: Dict[str, "FlashInferImpl"], num_tokens: int
) -> Iterator[ForwardContext]:
    assert attn_metadata is None or num_tokens >= attn_metadata.num_actual_tokens  # expect: FC109
    global _forward_context
    prev = _forward_context
    _forward_context = ForwardContext(attn_metadata, attn_impls, num_tokens)
    try:
        yield _forward_context
    finally:
        _forward_context = prev
