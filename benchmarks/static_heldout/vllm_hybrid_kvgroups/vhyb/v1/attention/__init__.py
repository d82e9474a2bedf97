from .flashinfer import CommonAttentionMetadata, FlashInferGroupBuilder, FlashInferImpl, FlashInferMetadata, SlidingWindowGroupBuilder
from .workspace import get_shared_workspace

__all__ = ["CommonAttentionMetadata", "FlashInferGroupBuilder", "FlashInferImpl", "FlashInferMetadata", "SlidingWindowGroupBuilder", "get_shared_workspace"]
