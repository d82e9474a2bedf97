"""Prompt logprobs for chunked prefills: config, request state and the per-chunk collector."""

from .collector import PromptLogprobCollector
from .config import LogprobConfig
from .requests import ChunkPlan, LogprobRequest

__all__ = ["ChunkPlan", "LogprobConfig", "LogprobRequest", "PromptLogprobCollector"]
