"""Sampling with penalties, min-p and top-n logprobs; host history and streaming."""

from .history import TokenHistory
from .ops import apply_penalties, exponential_race, min_p_filter, topn_logprobs
from .params import ModelConfig, SamplingParams, SamplingTensors
from .response import Detokenizer, SamplerOutput, StreamingResponseBuilder

__all__ = [
    "TokenHistory", "apply_penalties", "exponential_race", "min_p_filter", "topn_logprobs",
    "ModelConfig", "SamplingParams", "SamplingTensors", "Detokenizer", "SamplerOutput",
    "StreamingResponseBuilder",
]
