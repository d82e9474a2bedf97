"""CPU reference attention in fp32: the numerical oracle for every target (numpy only)."""

from flashcheck.reference.attention import (
    gather_paged_kv,
    mla_reference,
    paged_attention,
    ragged_attention,
    request_attention,
)

__all__ = ["gather_paged_kv", "mla_reference", "paged_attention", "ragged_attention", "request_attention"]
