"""Warm restart for a paged-KV decode engine.

On shutdown (or every few minutes) the engine writes its KV pages, the request-to-page table,
the scheduler's queues and per-wrapper state to a snapshot directory; after a restart it loads
them back, rebuilds page tables, wrappers and CUDA graphs, and resumes every request where it
stopped instead of re-prefilling it.
"""
