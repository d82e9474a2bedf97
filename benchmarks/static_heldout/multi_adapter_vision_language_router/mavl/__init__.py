"""Multi-adapter VLM routing: config, adapter bank, router."""

from .adapters import AdapterBank, SegmentInfo
from .config import AdapterSpec, RouterConfig, vision_ws_bytes
from .routing import AdapterRouter, DecodeRoute, PromptRoute, Request
from .util import fill_tail, ids_summary

__all__ = [
    "AdapterBank", "SegmentInfo", "AdapterSpec", "RouterConfig", "vision_ws_bytes",
    "AdapterRouter", "DecodeRoute", "PromptRoute", "Request", "fill_tail", "ids_summary",
]
