"""YOCO serving: a sliding-window self-decoder feeding one global KV cache that every cross-decoder layer reads."""

__version__ = "0.5.1"
