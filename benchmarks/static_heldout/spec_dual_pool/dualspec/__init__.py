"""Two-model speculative decoding: a small draft and the target share one pool of KV blocks."""
