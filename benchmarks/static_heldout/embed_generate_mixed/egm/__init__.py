"""One engine for embedding and generation requests, batched together each step."""
