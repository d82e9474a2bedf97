"""A ForwardContext global that the engine sets once per step and attention layers read."""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch

logger = logging.getLogger(__name__)


@dataclass
class AttnMetadata:
    num_reqs: int
    num_decodes: int
    num_prefills: int
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    slot_mapping: torch.Tensor

    @property
    def num_actual_tokens(self) -> int:
        return int(self.query_start_loc[self.num_reqs])  # expect: FC101

    @property
    def num_actual_tokens_host(self) -> int:
        return int(self.query_start_loc_cpu[self.num_reqs])  # ok: FC101


@dataclass
class ForwardContext:
    attn_metadata: Optional[AttnMetadata]
    virtual_engine: int = 0
    capturing: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


_forward_context: Optional[ForwardContext] = None


def get_forward_context() -> ForwardContext:
    assert _forward_context is not None, "forward context is not set"  # ok: FC109
    return _forward_context


@contextlib.contextmanager
def set_forward_context(attn_metadata: Optional[AttnMetadata], virtual_engine: int = 0,
                        capturing: bool = False) -> Iterator[None]:
    global _forward_context
    assert virtual_engine >= 0  # expect: FC109
    if attn_metadata is not None:
        logger.debug("step seq_lens=%s", attn_metadata.seq_lens)  # ok: FC101
    prev = _forward_context
    _forward_context = ForwardContext(attn_metadata, virtual_engine, capturing)
    try:
        yield
    finally:
        _forward_context = prev
