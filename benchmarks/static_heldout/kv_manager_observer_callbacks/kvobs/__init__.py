"""kvobs: a paged KV-cache block manager that notifies its observers (attention backends, graph runners)."""
from kvobs.config import DECODE_BUCKETS, PAGE_SIZE, PREFILL_WS_MB, ServerConfig, WsSize
from kvobs.listeners import ListenerList

__all__ = ["DECODE_BUCKETS", "PAGE_SIZE", "PREFILL_WS_MB", "ServerConfig", "WsSize", "ListenerList"]
