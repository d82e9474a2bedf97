"""Tensor-parallel decode with vocabulary-parallel sampling.

The LM head is sharded by vocabulary: each rank holds logits for its slice only. Sampling takes a
local top-k on every rank, all-gathers the candidates (values and global ids packed in one
buffer), and every rank draws the same token from the merged candidates with a shared seed.
"""
