"""tkvi: an SGLang-shaped serving engine whose FlashInfer metadata is built on the device by Triton kernels.

The Triton kernels live in the namespace folder ``tkv_kernels/`` next to this package (no ``__init__.py``),
shared with the offline benchmark scripts.
"""

__version__ = "0.4.0"
