"""Query-aware sparse attention (Quest) on paged KV caches."""
