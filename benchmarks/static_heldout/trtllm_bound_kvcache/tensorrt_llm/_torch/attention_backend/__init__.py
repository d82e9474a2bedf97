from .fi_metadata import FlashInferAttentionMetadata, PlanParams
from .flashinfer_backend import FlashInferBackend

__all__ = ["FlashInferAttentionMetadata", "FlashInferBackend", "PlanParams"]
