"""Sarathi-style chunked-prefill serving: decodes piggyback prefill chunks under a per-step token budget."""

__version__ = "0.3.1"
