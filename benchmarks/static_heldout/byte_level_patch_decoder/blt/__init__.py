"""Byte-level latent transformer: bytes grouped into entropy-driven patches."""
from .config import XATTN_WORKSPACE_BYTES, ByteModelConfig, PatchBuckets
from .entropy import EntropyModel, EntropyPatcher
from .patching import PatchBatch, byte_to_patch_index, cu_patches, group_patches

__all__ = [
    "XATTN_WORKSPACE_BYTES",
    "ByteModelConfig",
    "PatchBuckets",
    "EntropyModel",
    "EntropyPatcher",
    "PatchBatch",
    "byte_to_patch_index",
    "cu_patches",
    "group_patches",
]
