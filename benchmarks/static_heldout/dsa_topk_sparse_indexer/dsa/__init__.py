"""DeepSeek-V3.2-style sparse attention: a lightning indexer picks top-k token slots per query."""

from .batch import DecodeBatch, ExtendBatch, Request
from .config import DSAConfig

__all__ = ["DSAConfig", "DecodeBatch", "ExtendBatch", "Request"]
