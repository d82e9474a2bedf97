"""Attention paths picked by `isinstance` against runtime-checkable protocols; no backend base class."""
from .config import ServeConfig
from .protocols import AttentionImpl, SupportsCascade, SupportsCudaGraph, SupportsEagerPlan

__all__ = ["AttentionImpl", "ServeConfig", "SupportsCascade", "SupportsCudaGraph", "SupportsEagerPlan"]
