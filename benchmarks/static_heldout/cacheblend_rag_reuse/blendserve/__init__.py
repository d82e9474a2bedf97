"""CacheBlend-style serving for RAG prompts: the KV of retrieved chunks is precomputed once, reused
across requests from a chunk store, and only the tokens whose KV deviates most at the first layer
are recomputed in the later layers (cross-chunk attention is restored for them)."""
