from msengine.attention.flashinfer_backend import (
    FlashInferImpl,
    FlashInferMetadata,
    FlashInferMetadataBuilder,
    FlashInferState,
)

__all__ = ["FlashInferImpl", "FlashInferMetadata", "FlashInferMetadataBuilder", "FlashInferState"]
