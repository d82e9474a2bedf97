"""wrl: a small FlashInfer serving runtime whose components are linked by weak references.

The model runner owns every long-lived object (workspaces, input and graph buffers, the KV pool,
graph-mode wrappers through the graph entries). Everything else points back at it weakly:
the graph runner holds a ``weakref.proxy`` of the model runner, the attention backend a
``weakref.ref``, the wrapper cache a ``WeakValueDictionary``, step hooks are ``WeakMethod``s and
device memory is released through ``weakref.finalize``. Tearing an engine down (sleep mode
between RL rollouts, tests that build several engines in one process) then frees GPU memory
without breaking reference cycles by hand.
"""

from wrl.config import EngineConfig
from wrl.model_runner import ModelRunner

__all__ = ["EngineConfig", "ModelRunner"]
