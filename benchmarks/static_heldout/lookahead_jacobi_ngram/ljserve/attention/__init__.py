from ljserve.attention.backend import LookaheadAttnBackend, PromptMetadata, StepMetadata

__all__ = ["LookaheadAttnBackend", "PromptMetadata", "StepMetadata"]
