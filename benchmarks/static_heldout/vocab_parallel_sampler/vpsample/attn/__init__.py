"""Per-rank FlashInfer attention metadata (each rank owns a slice of the heads)."""
