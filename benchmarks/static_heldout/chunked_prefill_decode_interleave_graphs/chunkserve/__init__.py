"""Chunked prefill interleaved with decode steps under a token budget."""

from chunkserve.budget import TokenBudget
from chunkserve.config import ChunkConfig, WsSize
from chunkserve.request import PrefillChunk, Request, StepPlan
from chunkserve.scheduler import ChunkedScheduler

__all__ = ["ChunkConfig", "ChunkedScheduler", "PrefillChunk", "Request", "StepPlan", "TokenBudget", "WsSize"]
