from diffserve.attention.backend import DiffAttnBackend
from diffserve.attention.metadata import DiffForwardBatch

__all__ = ["DiffAttnBackend", "DiffForwardBatch"]
