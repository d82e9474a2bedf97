"""Multi-token-prediction chain speculative decoding (config, heads, graph building)."""

from mtpchain.config import MTPConfig

__all__ = ["MTPConfig"]
