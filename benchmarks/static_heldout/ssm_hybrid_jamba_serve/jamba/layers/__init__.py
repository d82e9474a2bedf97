"""Attention and Mamba backends of the hybrid server."""
from jamba.layers.flashinfer_backend import JambaFlashInferBackend
from jamba.layers.hybrid_backend import HybridJambaBackend
from jamba.layers.mamba_backend import MambaBackend

__all__ = ["HybridJambaBackend", "JambaFlashInferBackend", "MambaBackend"]
