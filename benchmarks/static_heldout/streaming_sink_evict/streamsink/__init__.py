"""StreamingLLM-style serving: attention sinks plus a rolling window of KV pages, evicted every step."""
