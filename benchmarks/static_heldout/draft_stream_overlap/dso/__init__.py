"""Speculative decoding with the draft model overlapped on a second CUDA stream."""
