"""FlashInfer attention for protoserve: the prototype wrapper set, per-bucket clones, the eager backend."""

from protoserve.attention.context import AttnContext
from protoserve.attention.wrappers import DecodeWrapperSet

__all__ = ["AttnContext", "DecodeWrapperSet"]
