"""A continuous batcher that preempts by swapping KV blocks to pinned host memory."""
