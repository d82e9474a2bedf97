from q3n.attn.full_attn import FlashInferFullAttnBackend, FullAttnMetadata
from q3n.attn.gdn import GDNAttnBackend, GDNMetadata, HybridLinearAttnBackend

__all__ = [
    "FlashInferFullAttnBackend",
    "FullAttnMetadata",
    "GDNAttnBackend",
    "GDNMetadata",
    "HybridLinearAttnBackend",
]
