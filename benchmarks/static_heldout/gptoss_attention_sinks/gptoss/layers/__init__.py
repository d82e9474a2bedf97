from gptoss.layers.attention import SinkAttention
from gptoss.layers.moe import ExpertDispatcher, MoEBlock, Router

__all__ = ["SinkAttention", "ExpertDispatcher", "MoEBlock", "Router"]
