"""Properties: named invariants over observations, pure functions that return `Finding` lists (no torch)."""

from flashcheck.properties.csr import CsrInput, check_csr, check_layout

__all__ = ["CsrInput", "check_csr", "check_layout"]
