"""rpp: a small serving engine with automatic prefix caching, chunked prefill and
preemption by recompute, over FlashInfer paged attention and CUDA graphs for decode."""

__version__ = "0.3.0"
