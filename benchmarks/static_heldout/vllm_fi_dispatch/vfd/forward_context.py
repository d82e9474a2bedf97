"""Per-step forward context shared by the model runner, the graph wrapper and the attention layers."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

from vfd.config import CUDAGraphMode, VllmConfig


class BatchDescriptor(NamedTuple):
    num_tokens: int
    uniform_decode: bool = False

    @property
    def non_uniform(self) -> "BatchDescriptor":
        return BatchDescriptor(self.num_tokens, uniform_decode=False)


@dataclass
class ForwardContext:
    attn_metadata: Any
    vllm_config: VllmConfig
    cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE
    batch_descriptor: Optional[BatchDescriptor] = None


_forward_context: Optional[ForwardContext] = None


def get_forward_context() -> ForwardContext:
    if _forward_context is None:
        raise RuntimeError("forward context is not set; run the model inside set_forward_context()")
    return _forward_context


@contextmanager
def set_forward_context(attn_metadata, vllm_config, cudagraph_runtime_mode=CUDAGraphMode.NONE, batch_descriptor=None):
    global _forward_context
    prev = _forward_context
    _forward_context = ForwardContext(attn_metadata, vllm_config, cudagraph_runtime_mode, batch_descriptor)
    try:
        yield
    finally:
        _forward_context = prev
