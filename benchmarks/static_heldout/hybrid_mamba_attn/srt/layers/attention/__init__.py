"""Attention backends of the hybrid runner (full attention through FlashInfer, linear layers through the
state-space kernels)."""
