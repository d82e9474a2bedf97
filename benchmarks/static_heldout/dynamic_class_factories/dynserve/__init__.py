"""dynserve: a small paged-KV serving engine built around FlashInfer.

Attention backends are not written as one class per configuration: ``make_backend`` composes the
feature mixins a deployment needs (decode, prefill, CUDA graphs, trtllm-gen, sliding window) into a
class at start-up, and the graph runner gets its replay half from a class decorator and its capture
half from ``type()``.
"""

from .config import EngineConfig

__all__ = ["EngineConfig"]
__version__ = "0.4.0"
