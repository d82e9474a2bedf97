from cpring.attention.decode_backend import CPDecodeBackend, DecodeMetadata
from cpring.attention.ring_prefill import RingPrefillAttention

__all__ = ["CPDecodeBackend", "DecodeMetadata", "RingPrefillAttention"]
