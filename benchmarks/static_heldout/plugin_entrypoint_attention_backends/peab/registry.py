"""Attention backend plugins: a decorator registry, import by name and package entry points."""
from __future__ import annotations

import importlib
import importlib.metadata
import logging
from typing import Callable, Dict

import torch

from peab.config import PLUGIN_PACKAGE, EngineConfig
from peab_plugins.base import AttentionBackend

logger = logging.getLogger(__name__)
_BACKENDS: Dict[str, type] = {}
DEFAULT_CLASS_ATTR = "BACKEND_CLASS"  # a plugin module that does not register itself names its class here


def register_backend(name: str) -> Callable[[type], type]:
    assert name not in _BACKENDS, f"attention backend {name!r} registered twice"  # expect: FC109

    def deco(cls: type) -> type:
        _BACKENDS[name] = cls
        cls.plugin_name = name
        return cls

    return deco


def _from_entry_points(name: str) -> str:
    for ep in importlib.metadata.entry_points(group="peab.attention_backends"):
        if ep.name == name:
            return ep.value.replace(f"{PLUGIN_PACKAGE}.", "", 1)
    return name


def load_backend(spec: str) -> type:
    """`fi_paged` (registered, or imported from peab_plugins on first use) or `module:Class`."""
    if spec in _BACKENDS:
        return _BACKENDS[spec]
    module_name, _, class_name = _from_entry_points(spec).partition(":")
    module = importlib.import_module(f"{PLUGIN_PACKAGE}.{module_name}")
    if not class_name:
        if spec in _BACKENDS:  # importing the module ran its @register_backend
            return _BACKENDS[spec]
        class_name = getattr(module, DEFAULT_CLASS_ATTR)
    cls = getattr(module, class_name)
    assert isinstance(cls, type), f"{spec} does not name a class"  # expect: FC109
    return cls


def create_backend(spec: str, cfg: EngineConfig, layer_type: str, device: torch.device) -> AttentionBackend:
    cls = load_backend(spec)
    logger.info("layer type %s -> attention plugin %s (%s)", layer_type, spec, cls.__name__)
    return cls(cfg, layer_type, device)


def registered() -> Dict[str, type]:
    return dict(_BACKENDS)
