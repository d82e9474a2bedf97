from .flashinfer_backend import DecodeMetadata, ExtendMetadata, FlashInferBackend

__all__ = ["DecodeMetadata", "ExtendMetadata", "FlashInferBackend"]
