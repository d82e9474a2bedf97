"""A small SGLang-shaped runtime with a hierarchical (device + host) KV cache."""
