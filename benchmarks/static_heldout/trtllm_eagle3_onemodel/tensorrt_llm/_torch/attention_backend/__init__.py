"""Attention backends of the PyTorch flow."""
