from bloomserve.backend.flashinfer_alibi import AlibiFlashInferBackend

__all__ = ["AlibiFlashInferBackend"]
