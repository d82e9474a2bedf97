from .flashinfer_backend import AttnMetadata, FlashInferBackend

__all__ = ["AttnMetadata", "FlashInferBackend"]
