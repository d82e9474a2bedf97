"""Single-GPU edge server for a small W8A8 model: batch of 1-4, one decode CUDA graph per sequence-length bucket."""
from edge.settings import EdgeSettings

__all__ = ["EdgeSettings"]
