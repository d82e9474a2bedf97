"""FlashInfer attention for the plugin server."""
