from l4serve.attention.common import CommonAttentionMetadata, make_local_attention_virtual_batches
from l4serve.attention.flashinfer_backend import (
    ChunkedLocalAttentionImpl,
    FlashInferImpl,
    FlashInferMetadataBuilder,
    LocalChunkedMetadataBuilder,
)

__all__ = [
    "ChunkedLocalAttentionImpl",
    "CommonAttentionMetadata",
    "FlashInferImpl",
    "FlashInferMetadataBuilder",
    "LocalChunkedMetadataBuilder",
    "make_local_attention_virtual_batches",
]
