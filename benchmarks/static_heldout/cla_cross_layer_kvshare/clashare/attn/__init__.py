from clashare.attn.backend import CLAFlashInferBackend

__all__ = ["CLAFlashInferBackend"]
