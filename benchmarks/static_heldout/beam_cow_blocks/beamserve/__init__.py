"""beamserve: beam search with copy-on-write KV blocks and FlashInfer decode graphs."""
