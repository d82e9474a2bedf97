"""tabserve: a small serving engine whose per-step attention work is chosen from enum-keyed tables."""

from tabserve.modes import Feature, ForwardMode, SamplingFlag

__all__ = ["Feature", "ForwardMode", "SamplingFlag"]
__version__ = "0.3.0"
