"""duoserve: DuoAttention serving. Each layer's KV heads are split by a learned gate
into retrieval heads (full KV cache) and streaming heads (attention sinks plus a
recent window); the two groups decode through separate FlashInfer wrappers."""
