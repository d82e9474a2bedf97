"""A small chunked-prefill engine with CUDA-graph decode and a CUDA-graph-captured sampler."""

from . import sampling as sampling
from .core import EngineCore
from .scheduler import BlockAllocator, ChunkedScheduler, Request, SamplingParamsBatch

__all__ = ["BlockAllocator", "ChunkedScheduler", "EngineCore", "Request", "SamplingParamsBatch", "sampling"]
