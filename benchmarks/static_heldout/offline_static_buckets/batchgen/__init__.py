"""Offline batch generation over static (batch, prompt-length) buckets."""
