"""The decode stage: per-bucket decode graphs over pages received from the prefill stage."""

from .decode_attn import DecodeAttnBackend, DecodeBatch

__all__ = ["DecodeAttnBackend", "DecodeBatch"]
