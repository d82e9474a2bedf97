"""Offline batch-inference API: JSONL jobs in, huge static batches padded to a few lengths, one CUDA graph
per padded length."""
