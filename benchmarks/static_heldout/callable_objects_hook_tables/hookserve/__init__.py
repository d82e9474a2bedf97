"""Hook-table serving engine: configuration, batches and replay hooks."""
