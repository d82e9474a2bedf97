"""mmserve: several small and mid-size models resident on one GPU.

Each resident model owns its attention backend, its workspace and its own CUDA
graph memory pool, so switching the active model never re-captures anything.
"""

from mmserve.registry import ModelRegistry, ModelSpec

__all__ = ["ModelRegistry", "ModelSpec"]
