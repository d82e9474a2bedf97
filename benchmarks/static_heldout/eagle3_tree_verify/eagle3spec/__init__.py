"""EAGLE-3 speculative decoding with a static draft tree verified by FlashInfer tree attention."""
