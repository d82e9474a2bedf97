"""Attention backends. Only FlashInfer is implemented; it imports FlashInfer through compat."""
