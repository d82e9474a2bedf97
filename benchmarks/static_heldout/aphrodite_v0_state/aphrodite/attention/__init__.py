"""Attention backends; the worker imports the FlashInfer one from here."""

from . import flashinfer_backend as backend
from .flashinfer_backend import FlashInferImpl, FlashInferMetadata, FlashInferMetadataBuilder, FlashInferState
from .state import CommonAttentionState, CommonMetadataBuilder, WindowCompatMixin

__all__ = [
    "CommonAttentionState",
    "FlashInferImpl",
    "FlashInferMetadata",
    "FlashInferMetadataBuilder",
    "FlashInferState",
    "WindowCompatMixin",
    "backend",
]
