from ulysses_sp.attn.backend import UlyssesFlashInferBackend

__all__ = ["UlyssesFlashInferBackend"]
