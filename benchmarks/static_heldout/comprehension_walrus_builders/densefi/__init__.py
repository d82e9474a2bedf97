"""densefi: a FlashInfer serving engine whose start-up and per-step code is written in a dense functional style.

Per-layer-group wrappers, workspaces and index buffers are built by comprehensions over the engine's layer
groups and captured batch sizes; the model runner, the metadata builder and the CUDA-graph manager follow
vLLM v1's split of responsibilities.
"""

from densefi.config import EngineConfig

__all__ = ["EngineConfig"]
__version__ = "0.3.0"
