"""FlashInfer field names the diagnostics read (they moved between 0.2.x releases)."""

_INDICES_FIELD = "_paged_kv_indices_buf"
