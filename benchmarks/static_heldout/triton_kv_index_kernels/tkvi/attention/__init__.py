"""Attention backends and their per-step planners."""

from tkvi.attention.flashinfer_backend import AttentionBackend, FlashInferAttnBackend

__all__ = ["AttentionBackend", "FlashInferAttnBackend"]
