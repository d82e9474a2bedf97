"""Cross-layer attention (CLA) serving: adjacent layers share one KV cache."""

__all__ = ["config", "groups"]
