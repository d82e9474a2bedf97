"""cfgserve: serves LlamaGen / Janus-style image generators. Every request decodes as
a pair of rows, conditional and unconditional, whose logits are mixed with a
guidance scale before the image token is sampled."""
