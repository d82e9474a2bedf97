from modserve.attention.flashinfer_backend import FlashInferModuleBackend

__all__ = ["FlashInferModuleBackend"]
