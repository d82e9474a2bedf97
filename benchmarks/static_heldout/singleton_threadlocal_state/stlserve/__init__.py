"""stlserve: a multi-threaded decode server.

Components are process singletons (``EngineConfig.get_instance()``, ``WorkspaceManager()``,
``FlashInferBackend.get_instance()``, ``ModelRunner.get_instance()``) and per-thread state
(``stlserve.thread_state.ThreadState``). Import the submodules you need; nothing heavy is imported here.
"""

from stlserve.config import EngineConfig

__all__ = ["EngineConfig", "__version__"]
__version__ = "0.4.2"
