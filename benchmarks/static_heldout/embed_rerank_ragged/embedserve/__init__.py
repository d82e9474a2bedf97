"""A text-embedding / cross-encoder reranker server: no decode, packed bidirectional prefill only."""
