"""FlashInfer attention: plan recipes and the table-driven backend."""
