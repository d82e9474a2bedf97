"""mroserve: a serving engine whose attention backends are assembled from mixins.

The model and scheduler side live here; the attention backends live in the
``mroserve_attn`` namespace package so that out-of-tree backends can add modules
to it without touching this package.
"""

__version__ = "0.4.2"

__all__ = ["__version__"]
