"""Engine loop, graph cache and sampler on top of the paged KV state."""
