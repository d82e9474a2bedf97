"""Attention backends of the PyTorch flow; the executor imports everything from here."""

from . import interface as interface
from .flashinfer import FlashInferAttention as FlashInferAttention
from .flashinfer import FlashInferAttentionMetadata as FlashInferAttentionMetadata
from .interface import AttentionMetadata, KVCacheParams, PlanParams

__all__ = [
    "AttentionMetadata",
    "FlashInferAttention",
    "FlashInferAttentionMetadata",
    "KVCacheParams",
    "PlanParams",
    "interface",
]
