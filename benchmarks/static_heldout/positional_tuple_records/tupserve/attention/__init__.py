from .flashinfer_backend import FlashInferTupleBackend

__all__ = ["FlashInferTupleBackend"]
