"""A decode server with user-pluggable logits processors.

Processors are registered by name (``@register_processor("bad_words")``) and listed in the
server configuration. Host processors run between steps on the CPU side and write an additive
bias; graph processors are recorded into the decode CUDA graph with the model and the sampler.
"""

__version__ = "0.4.2"
