from .pinned_ring import PinnedOutputRing

__all__ = ["PinnedOutputRing"]
