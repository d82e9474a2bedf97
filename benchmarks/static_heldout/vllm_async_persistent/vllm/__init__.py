"""vLLM v1-style engine pieces: persistent batch, async scheduling, FlashInfer attention."""
