"""FlashInfer attention over the FP8 cache."""
