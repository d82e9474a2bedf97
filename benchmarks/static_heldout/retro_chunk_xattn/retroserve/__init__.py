"""RETRO-style serving: chunked cross-attention to retrieved neighbours every chunk_size tokens."""
