"""dwserve: a paged-KV decode engine whose steps are wrapped by project decorators."""
