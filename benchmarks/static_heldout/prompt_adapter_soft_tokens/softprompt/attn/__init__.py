from .backend import SoftPromptAttention
from .metadata import SoftBatch, StepMetaBuilder, StepMetadata

__all__ = ["SoftPromptAttention", "SoftBatch", "StepMetaBuilder", "StepMetadata"]
