"""Run-time resolution of components from dotted names.

Three spellings are used across the engine:

* ``"pkg.module.Attr"``: a qualified name, resolved with :func:`resolve_obj_by_qualname` (vLLM's helper);
* ``"pkg.module:Attr"``: a plugin spec (entry-point syntax), resolved with :func:`load_plugin`, which reuses a
  module another plugin already imported (``sys.modules``) and imports it with ``__import__`` otherwise;
* a key of ``qrserve.config.KV_HELPERS``: resolved with :func:`get_kv_helper_cls`.
"""

from __future__ import annotations

import importlib
import logging
import sys
from types import ModuleType
from typing import Any

from qrserve.config import KV_HELPERS

logger = logging.getLogger(__name__)


def resolve_obj_by_qualname(qualname: str) -> Any:
    """Resolve ``"pkg.module.Attr"`` to the object it names."""
    assert "." in qualname, f"not a qualified name: {qualname!r}"  # expect: FC109
    module_name, obj_name = qualname.rsplit(".", 1)
    module = importlib.import_module(module_name)
    return getattr(module, obj_name)


def instantiate(qualname: str, *args: Any, **kwargs: Any) -> Any:
    """Resolve a class by qualified name and build it."""
    cls = resolve_obj_by_qualname(qualname)
    logger.debug("instantiating %s", qualname)
    return cls(*args, **kwargs)


def import_plugin_module(module_name: str) -> ModuleType:
    """Return the plugin module, importing it only if no other plugin did."""
    module = sys.modules.get(module_name)
    if module is None:
        __import__(module_name)
        module = sys.modules[module_name]
    return module


def load_plugin(spec: str) -> Any:
    """Resolve an entry-point style ``"pkg.module:Attr"`` spec."""
    module_name, _, attr = spec.partition(":")
    assert attr, f"plugin spec {spec!r} must look like 'pkg.module:Attr'"  # expect: FC109
    return getattr(import_plugin_module(module_name), attr)


def get_kv_helper_cls(name: str) -> type:
    """Resolve one of the KV-cache helpers named in ``KV_HELPERS``."""
    qualname = KV_HELPERS[name]
    module_name, _, cls_name = qualname.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None:
        module = __import__(module_name, fromlist=[cls_name])
    return getattr(module, cls_name)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(x: int, multiple: int) -> int:
    return cdiv(x, multiple) * multiple
