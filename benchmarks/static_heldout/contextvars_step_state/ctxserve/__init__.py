"""ctxserve: per-step state kept in contextvars and a thread-local, read back deep in the forward."""
