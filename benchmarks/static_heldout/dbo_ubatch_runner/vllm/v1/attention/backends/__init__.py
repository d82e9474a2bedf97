"""Attention backends (v1)."""
