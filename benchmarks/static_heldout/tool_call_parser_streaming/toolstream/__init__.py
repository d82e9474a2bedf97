"""Streaming tool calls: an incremental parser on the host and stop detection on the device."""
from .config import PREFILL_BACKEND, ServerConfig
from .parser import StreamingToolParser, ToolCallDelta
from .stops import StopMatcher

__all__ = ["PREFILL_BACKEND", "ServerConfig", "StopMatcher", "StreamingToolParser", "ToolCallDelta"]
