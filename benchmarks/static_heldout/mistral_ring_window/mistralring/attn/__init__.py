from mistralring.attn.backend import RingWindowBackend

__all__ = ["RingWindowBackend"]
