"""qrserve: a small vLLM-shaped serving engine.

Nothing in the runtime imports its components by name: the model runner reads qualified names from
``qrserve.config`` (per platform and mode) and resolves them with ``qrserve.utils``. Only the helpers are
re-exported here so that plugins can resolve names the same way.
"""

from qrserve.utils import instantiate, load_plugin, resolve_obj_by_qualname

__version__ = "0.3.0"

__all__ = ["instantiate", "load_plugin", "resolve_obj_by_qualname", "__version__"]
