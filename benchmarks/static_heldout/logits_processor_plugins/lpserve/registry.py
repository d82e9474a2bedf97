"""Name -> class registry for logits processors (built-ins and entry-point plugins)."""
from __future__ import annotations

import importlib
import logging
from importlib import metadata
from typing import Callable, Dict, List, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=type)

PROCESSORS: Dict[str, type] = {}

BUILTIN_MODULES = (
    "lpserve.processors.penalties",
    "lpserve.processors.bad_words",
    "lpserve.processors.json_mode",
)
ENTRY_POINT_GROUP = "lpserve.logits_processors"


def register_processor(name: str) -> Callable[[T], T]:
    def deco(cls: T) -> T:
        if name in PROCESSORS and PROCESSORS[name] is not cls:
            raise KeyError(f"logits processor {name!r} already registered by {PROCESSORS[name].__module__}")
        cls.plugin_name = name
        PROCESSORS[name] = cls
        return cls

    return deco


def load_plugins() -> List[str]:
    for mod in BUILTIN_MODULES:
        importlib.import_module(mod)
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception:  # a broken third-party plugin must not take the server down
            logger.exception("failed to load logits processor plugin %s", ep.name)
    return sorted(PROCESSORS)


def processor_class(name: str) -> type:
    try:
        return PROCESSORS[name]
    except KeyError:
        raise KeyError(f"unknown logits processor {name!r}; registered: {sorted(PROCESSORS)}") from None
