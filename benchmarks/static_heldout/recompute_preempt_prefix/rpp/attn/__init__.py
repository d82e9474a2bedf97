from rpp.attn.backend import FlashInferImpl
from rpp.attn.builder import FlashInferMetadataBuilder
from rpp.attn.metadata import CommonAttentionMetadata, FlashInferMetadata

__all__ = ["CommonAttentionMetadata", "FlashInferImpl", "FlashInferMetadata", "FlashInferMetadataBuilder"]
