"""Prompt-lookup decoding engine (LightLLM-style token pool, FlashInfer decode graphs per batch bucket)."""
