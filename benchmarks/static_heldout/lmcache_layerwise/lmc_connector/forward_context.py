"""The per-step forward context that attention layers read (vLLM's ``get_forward_context``)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional

from lmc_connector.attention.flashinfer_builder import FlashInferMetadata

if TYPE_CHECKING:
    from lmc_connector.connector import LayerwiseKVConnector


@dataclass
class ForwardContext:
    attn_metadata: FlashInferMetadata
    connector: Optional["LayerwiseKVConnector"] = None


_forward_context: Optional[ForwardContext] = None


def get_forward_context() -> ForwardContext:
    if _forward_context is None:
        raise RuntimeError("attention called outside set_forward_context")
    return _forward_context


@contextlib.contextmanager
def set_forward_context(attn_metadata: FlashInferMetadata, connector: Optional["LayerwiseKVConnector"]) -> Iterator[ForwardContext]:
    global _forward_context
    prev = _forward_context
    _forward_context = ForwardContext(attn_metadata=attn_metadata, connector=connector)
    try:
        yield _forward_context
    finally:
        _forward_context = prev
