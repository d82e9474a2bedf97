"""Beam search with copy-on-write KV pages: beams of a request share the prompt and every page their
histories share; a page is copied only when two beams would write into it."""
