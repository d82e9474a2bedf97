"""FlashInfer attention for the shared-expert MoE server."""
