"""Speculative decoding with two CUDA graph pools: draft decode and target verify."""
