from .fp8_flashinfer import Fp8DecodeWrapper, Fp8FlashInferMetadata
from .interface import ATTENTION_BACKENDS, AttentionMetadata, register_backend
from .workspace import WorkspaceTier, alloc_workspace

__all__ = ["ATTENTION_BACKENDS", "AttentionMetadata", "Fp8DecodeWrapper", "Fp8FlashInferMetadata", "WorkspaceTier",
           "alloc_workspace", "register_backend"]
