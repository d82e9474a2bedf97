"""Hybrid sliding-window / full-attention serving: every fourth layer attends the whole context."""

from swahybrid.config import HybridConfig, LayerKind, layer_kinds

__all__ = ["HybridConfig", "LayerKind", "layer_kinds"]
