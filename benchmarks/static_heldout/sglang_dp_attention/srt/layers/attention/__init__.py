from .flashinfer_backend import FlashInferDPAttnBackend

__all__ = ["FlashInferDPAttnBackend"]
