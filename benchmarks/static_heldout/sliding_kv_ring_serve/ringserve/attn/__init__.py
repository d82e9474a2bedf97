"""Attention backends over the ring KV cache."""
