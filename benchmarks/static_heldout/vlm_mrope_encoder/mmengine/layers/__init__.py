from .flashinfer_backend import FlashInferVLMBackend, clamp_pages_

__all__ = ["FlashInferVLMBackend", "clamp_pages_"]
