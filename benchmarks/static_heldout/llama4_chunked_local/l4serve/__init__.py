"""l4serve: Llama-4-style serving with chunked local attention beside global (NoPE) layers."""
