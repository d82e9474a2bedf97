"""protoserve: a decode-centric serving engine on FlashInfer paged attention.

One prototype graph runner is built at start-up and cloned per batch-size bucket
(``copy.copy`` shares the prototype's persistent buffers, ``copy.deepcopy`` gives a
bucket its own); each clone captures one CUDA graph.
"""

from protoserve.config import EngineConfig

__all__ = ["EngineConfig"]
__version__ = "0.3.0"
