"""Long-prompt prefill by KV splitting: configuration and the host-side chunk planner."""

from splitkv.config import GRAPH_FLAG_ATTR, SplitConfig
from splitkv.planner import ChunkPlanner, DecodeRows, LongPrompt, SplitPlan, StepWork

__all__ = ["GRAPH_FLAG_ATTR", "SplitConfig", "ChunkPlanner", "DecodeRows", "LongPrompt", "SplitPlan", "StepWork"]
